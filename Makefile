# User entry point. On a fresh Debian 12 machine (as root):
#   make demo   installs dependencies, builds the demo, runs it at 2 ranks
#   make test   installs dependencies, builds, runs the whole test suite
# Elsewhere, or as an ordinary user, `make deps` installs nothing: it lists
# what is missing, and the targets go on when everything is there. The plain
# CMake line needs no make at all (docs/building.md).
# MPI: the stack to build and test with (tools/mpi/stack): openmpi (Open
# MPI over its ob1 PML, the default), openmpi-ucx (Open MPI over UCX) or
# mpich. Each has its own build folder; openmpi-ucx differs from openmpi
# only at run time, so BUILD=build reuses the default build (CI does).
# CMAKE_ARGS: more options for the configure step.
MPI ?= openmpi
ifeq ($(MPI),openmpi)
BUILD ?= build
MPI_CMAKE := -DOVERLAP_MPI_STACK=
MPI_DEPS :=
else ifeq ($(MPI),openmpi-ucx)
BUILD ?= build-ucx
MPI_CMAKE := -DOVERLAP_MPI_STACK=openmpi-ucx
MPI_DEPS := libucx0
else ifeq ($(MPI),mpich)
BUILD ?= build-mpich
# Debian installs MPICH beside Open MPI under the suffix .mpich.
MPICH_CXX ?= $(or $(shell command -v mpicxx.mpich 2>/dev/null),mpicxx)
MPICH_EXEC ?= $(or $(shell command -v mpiexec.mpich 2>/dev/null),mpiexec)
MPI_CMAKE = -DMPI_CXX_COMPILER=$(MPICH_CXX) -DMPIEXEC_EXECUTABLE=$(MPICH_EXEC) -DOVERLAP_MPI_STACK=mpich
MPI_DEPS := mpich libmpich-dev
else
$(error MPI=$(MPI): use openmpi, openmpi-ucx or mpich)
endif
# The Python package (python/) and its tests; Debian's mpi4py is Open MPI's,
# so an MPICH build goes without them.
# libopenblas0-openmp: Debian's torch and NumPy call the system BLAS, the
# reference one (about 17x slower GEMMs) unless OpenBLAS provides it.
PYTHON_DEPS := pybind11-dev python3-dev python3-numpy python3-mpi4py python3-pytest python3-torch libopenblas0-openmp
ifeq ($(MPI),mpich)
PYTHON_DEPS :=
endif
BUILD_TYPE ?= Release
PREFIX ?= /usr/local
JOBS ?= $(shell nproc)

# ninja-build and ccache: every build folder is configured by
# tools/build/configure (Ninja, one compiler cache for all folders).
DEPS := cmake make ninja-build ccache g++ openmpi-bin libopenmpi-dev libeigen3-dev libdnnl-dev ocl-icd-opencl-dev \
        opencl-headers googletest libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev \
        pkg-config python3 iproute2 procps $(MPI_DEPS) $(PYTHON_DEPS)

# mpirun refuses root unless told; CI and the emulated cluster run as root.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: all deps bench-deps lint-deps smpi-deps configure build test check test-mpi test-isa asan tsan lint format demo bench \
        install clean docs clang ccache-stats \
        smpi test-smpi bench-smpi bench-smpi-scale

all: build

# Installs the Debian packages that are missing (root, apt), lists them
# (an ordinary user), or off Debian checks for the commands the build runs
# and leaves the libraries to CMake (tools/deps/check.sh, docs/building.md).
deps:
	@bash tools/deps/check.sh $(DEPS)

# Every build folder is configured through tools/build/configure: Ninja
# where installed, and ccache as the compiler launcher (one cache for every
# folder; docs/building.md, "Build times").
CONFIGURE := tools/build/configure

# The compiler cache's statistics (tools/build/ccache -s; CI prints them last).
ccache-stats:
	@if command -v ccache > /dev/null; then tools/build/ccache -s; else echo "ccache is not installed"; fi

configure: deps
	$(CONFIGURE) $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_EXPORT_COMPILE_COMMANDS=ON $(MPI_CMAKE) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# ctest -j: each MPI test declares its ranks as PROCESSORS, so ctest never
# runs more ranks at once than the machine has cores.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The quick tier, while working: the default build and every MPI suite at 1
# to 4 ranks (label mpi; not the 5-, 6- and 8-rank runs, the system tests,
# the Python tests or the other flavours: `make test` and CI's .ci/run run
# those). Minutes when the build is up to date (docs/building.md).
# Warnings are errors here, as in CI's make test: the same flags, so CI's
# run after this one finds every object of the default build in the cache.
check: CMAKE_ARGS += -DOVERLAP_WERROR=ON
check: build
	cd $(BUILD) && ctest -L '^mpi$$' -E '[.][5-9]ranks$$' --output-on-failure -j $(JOBS)

# The MPI suites only (label mpi): what CI runs under the stacks other than
# the default (make test-mpi MPI=mpich). TEST_ARGS: more ctest arguments,
# e.g. TEST_ARGS='-E [.]5ranks$$' for 1-4 ranks.
TEST_ARGS ?=
test-mpi: build
	cd $(BUILD) && ctest -L '^mpi$$' --output-on-failure -j $(JOBS) $(TEST_ARGS)

# The MPI suites again with oneDNN capped at AVX2 and at SSE4.1
# (ONEDNN_MAX_CPU_ISA), so a machine with AVX-512 proves the paths of smaller
# CPUs (bf16 then runs widened to f32). Capping cannot raise the ISA: on an
# AVX2 machine the AVX2 run is the native one. ISA_TESTS (a ctest -R regex)
# narrows the suites, e.g. ISA_TESTS='[.]3ranks$$' for one odd rank count.
ISAS ?= AVX2 SSE41
ISA_TESTS ?=
test-isa: build
	@for isa in $(ISAS); do \
	  echo "== MPI suites with ONEDNN_MAX_CPU_ISA=$$isa $(if $(ISA_TESTS),(tests matching $(ISA_TESTS)))"; \
	  (cd $(BUILD) && ONEDNN_MAX_CPU_ISA=$$isa ctest -L '^mpi$$' $(if $(ISA_TESTS),-R '$(ISA_TESTS)') --output-on-failure \
	    -j $(JOBS)) || exit 1; \
	done

# Clang with AddressSanitizer + UndefinedBehaviorSanitizer: Debian's clang++
# (14) with LLVM's OpenMP builds everything (the library, the apps, the
# tests, the benchmarks and the Python module) into $(BUILD)-asan with
# warnings as errors, as GCC builds $(BUILD) (CI sets OVERLAP_WERROR there),
# and the MPI suites run at 3 ranks (an odd count with uneven shards, where
# every schedule communicates) and the suites' 6-rank runs under the
# sanitizers; any report fails (tests/system/asan.sh). One build serves as
# CI's Clang build and its sanitizer build: the two took as long as GCC's
# whole build each. Not the header-only second build of the op suites (the
# same code).
# SANITIZE_OPT replaces RelWithDebInfo's -O2 -g, which came after the flags
# and overrode them: -O1 as the sanitizers' documentation advises, and -g1,
# the line tables a report's stack needs, without the full debug information
# that made the sanitized builds most of their stages' time in CI.
SANITIZE_OPT := -O1 -g1 -DNDEBUG
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
CLANG_DEPS := clang libomp-dev
asan:
	@$(MAKE) --no-print-directory deps DEPS="$(DEPS) $(CLANG_DEPS)"
	$(CONFIGURE) $(BUILD)-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DOVERLAP_WERROR=ON \
	  -DCMAKE_CXX_FLAGS="$(ASAN_FLAGS)" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SANITIZE_OPT)" \
	  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DOVERLAP_HEADER_ONLY_TESTS=OFF -DOVERLAP_TEST_RANKS=3 \
	  $(MPI_CMAKE) $(CMAKE_ARGS)
	cmake --build $(BUILD)-asan -j $(JOBS)
	bash tests/system/asan.sh $(BUILD)-asan

# ThreadSanitizer over the progress thread: the engine tests (a progress
# thread testing requests while a step computes, and a failing step),
# every policy x strategy at 3 ranks, started ops (the worker thread) and the transformer block's
# weight gradients beside them, built with -fsanitize=thread in
# $(BUILD)-tsan. Fails on any report. MPI and OpenMP are not instrumented;
# tests/system/tsan.supp lists what is suppressed there and why.
TSAN_FLAGS := -fsanitize=thread
tsan: deps
	$(CONFIGURE) $(BUILD)-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$(TSAN_FLAGS)" \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SANITIZE_OPT)" \
	  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DOVERLAP_BUILD_APPS=OFF -DOVERLAP_BUILD_BENCH=OFF -DOVERLAP_HEADER_ONLY_TESTS=OFF \
	  -DOVERLAP_BUILD_PYTHON=OFF
	cmake --build $(BUILD)-tsan -j $(JOBS) --target backend_test progress_test start_test transformer_test
	bash tests/system/tsan.sh $(BUILD)-tsan

# Clang without sanitizers, for a quick look while working: Debian's
# clang++ (14) builds everything into $(BUILD)-clang with warnings as errors,
# and the MPI suites run at 3 ranks. CI builds with Clang through make asan.
CLANG_TESTS ?= [.]3ranks$$
clang:
	@$(MAKE) --no-print-directory deps DEPS="$(DEPS) $(CLANG_DEPS)"
	$(CONFIGURE) $(BUILD)-clang -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_CXX_COMPILER=clang++ -DOVERLAP_WERROR=ON \
	  -DOVERLAP_HEADER_ONLY_TESTS=OFF $(MPI_CMAKE) $(CMAKE_ARGS)
	cmake --build $(BUILD)-clang -j $(JOBS)
	cd $(BUILD)-clang && ctest -L '^mpi$$' -R '$(CLANG_TESTS)' --output-on-failure -j $(JOBS)

# Layout and static checks (.clang-format, .clang-tidy): clang-format must
# leave every C++ file as it is, and clang-tidy's checks must pass on the
# headers (through src/instantiations.cpp, which instantiates every op, and
# tools/lint/every_header.cpp, which reaches the rest);
# no include cycle between the folders of include/overlap or between headers
# (tools/lint/include_cycles.py). The two clang-tidy runs go side by side
# (about 19 s each).
# `make format` applies the layout.
LINT_DEPS := clang-format clang-tidy doxygen
CXX_SOURCES = $(shell git ls-files '*.hpp' '*.cpp' 2>/dev/null || find include src apps tests bench docs -name '*.[hc]pp')

lint-deps:
	@$(MAKE) --no-print-directory deps DEPS="$(LINT_DEPS)"

lint: lint-deps configure docs
	python3 tools/lint/include_cycles.py include
	clang-format --dry-run -Werror $(CXX_SOURCES)
	printf '%s\n' src/instantiations.cpp tools/lint/every_header.cpp | \
	  xargs -P $(JOBS) -n 1 clang-tidy --quiet -p $(BUILD) --extra-arg=-std=c++17

# The API reference (Doxygen over include/overlap, docs/Doxyfile) into
# $(BUILD)/docs/html/index.html. A public entity without documentation, or
# a malformed comment, is a warning, and any warning fails the target (so
# `make lint`, which runs it, fails too).
docs: lint-deps
	@mkdir -p $(BUILD)/docs
	OVERLAP_DOCS_OUT=$(BUILD)/docs doxygen docs/Doxyfile
	@if [ -s $(BUILD)/docs/warnings.log ]; then \
	  cat $(BUILD)/docs/warnings.log >&2; \
	  echo "make docs: $$(wc -l < $(BUILD)/docs/warnings.log) Doxygen warning(s), above" >&2; exit 1; \
	fi
	@echo "make docs: $(BUILD)/docs/html/index.html"

format: lint-deps
	clang-format -i $(CXX_SOURCES)

# SimGrid SMPI: the library, overlap-bench, overlap-layer and the MPI suites
# built with smpicxx into $(BUILD)-smpi (build-smpi/); `make test-smpi` runs
# the suites under smpirun on a simulated 8-node cluster (tools/smpi/).
SMPI_BUILD ?= $(BUILD)-smpi
SMPI_DEPS := libsimgrid-dev

smpi-deps:
	@$(MAKE) --no-print-directory deps DEPS="$(DEPS) $(SMPI_DEPS)"

smpi: smpi-deps
	$(CONFIGURE) $(SMPI_BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_CXX_COMPILER=smpicxx -DOVERLAP_SMPI=ON \
	  -DOVERLAP_BUILD_BENCH=OFF
	cmake --build $(SMPI_BUILD) -j $(JOBS)

test-smpi: smpi
	cd $(SMPI_BUILD) && ctest --output-on-failure -j $(JOBS)

# On an emulated 2-node cluster when the machine allows it, else on shared
# memory. Builds only what the demo runs: overlap-layer (and, under MPICH,
# the tests' yield_when_idle library that tools/mpi/stack preloads).
DEMO_TARGETS := overlap-layer $(if $(filter mpich,$(MPI)),yield_when_idle)
demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target $(DEMO_TARGETS)
	bash bench/demo.sh $(BUILD)

# The sweep behind docs/results.md: gnuplot draws the plots, python3 writes
# the report, ScaLAPACK with OpenBLAS is the PSGEMM peer.
BENCH_DEPS := gnuplot-nox python3 pkg-config libscalapack-openmpi-dev libopenblas0-openmp

bench-deps:
	@$(MAKE) --no-print-directory deps DEPS="$(BENCH_DEPS)"

bench: bench-deps build smpi
	bash bench/sweep.sh $(BUILD)
	PROJECTION=$(BUILD)/bench/overlap-projection bash bench/smpi_sweep.sh $(SMPI_BUILD)

# The SMPI part alone (bench/smpi_sweep.sh): the mirrors of the emulated
# clusters and the cost model on simulated fat trees into docs/results.md,
# the scale runs into docs/scaling.md (beside the projection when $(BUILD)
# has bench/overlap-projection).
bench-smpi: smpi
	PROJECTION=$(BUILD)/bench/overlap-projection bash bench/smpi_sweep.sh $(SMPI_BUILD)

# The scale runs (bench/smpi_scale.sh): the three ops on simulated tensor
# groups of 8-64 ranks at 25, 100 and 200 Gbit/s (and of 8-32 on nodes of
# 128 cores), on 1024-rank dp x tp meshes, and single rings of 128 and 256
# ranks beside the projection (when $(BUILD) has bench/overlap-projection),
# timing only, into docs/scaling.md's opening tables and the cost model's
# list in docs/results.md. SCALE_RATES, SCALE_TP, SCALE_OPS, SCALE_MESHES,
# SCALE_RINGS, SCALE_128_RATES, SCALE_128_TP and SCALE_LIMIT_S narrow or
# bound it (an empty list skips its part and keeps its earlier rows).
bench-smpi-scale: smpi
	@$(MAKE) --no-print-directory deps DEPS="gnuplot-nox python3"
	PROJECTION=$(BUILD)/bench/overlap-projection bash bench/smpi_scale.sh $(SMPI_BUILD)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD)
