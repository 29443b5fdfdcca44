// The main of the public-header programs (tests/CMakeLists.txt, "Every
// public header alone"): each program is one header, included alone, and
// what a user of that header alone calls (uses/), linked. Running it only
// shows that it linked: the uses are never called.
void overlap_header_uses();

int main(int argc, char** /*argv*/) {
  if (argc < 0) overlap_header_uses();  // never: argc >= 0; keeps the uses referenced
  return 0;
}
