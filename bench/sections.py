"""Marked sections of the generated documents (docs/results.md, docs/scaling.md): a report
writes its own section between its markers and leaves the rest of the file alone, and a
report that rewrites a whole file keeps the sections other sweeps wrote."""
import os

# bench/smpi_scale_report.py's section (make bench-smpi-scale).
SMPI_SCALE = ("<!-- smpi-scale: begin -->", "<!-- smpi-scale: end -->")


def kept(path, markers):
    """The section of `path` between `markers`, markers included, or None."""
    begin, end = markers
    if not os.path.exists(path):
        return None
    text = open(path).read()
    if begin not in text or end not in text:
        return None
    return begin + text.split(begin, 1)[1].split(end, 1)[0] + end


def replace(path, markers, inner, after_title=False):
    """Writes `inner` between `markers` in `path`: in place of the section there, else after the
    file's title line (after_title), else at the end."""
    begin, end = markers
    text = open(path).read() if os.path.exists(path) else ""
    block = begin + "\n" + inner + end + "\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")  # prose after the section keeps its blank line
    elif after_title and text.startswith("# "):
        title, rest = text.split("\n", 1)
        text = title + "\n\n" + block + "\n" + rest.lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    open(path, "w").write(text)
