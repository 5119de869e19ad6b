# Tessera: `make demo` and `make test` work on a fresh Debian 12 machine; they install the
# build dependencies they find missing (apt-get, as root or through sudo).
BUILD_DIR := build
JOBS := $(shell nproc)

# Every Debian package the build and the tests need.
DEBIAN_PACKAGES := cmake make g++ pkg-config python3 \
  libgtest-dev libgmock-dev libbenchmark-dev \
  libcli11-dev libfmt-dev nlohmann-json3-dev libcpp-httplib-dev libcurl4-openssl-dev libssl-dev openssl \
  libyaml-cpp-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
# Only for the checks CI runs beyond `make test`: libFuzzer (clang) and the format check.
CHECK_PACKAGES := clang libclang-rt-14-dev clang-format
# How long each fuzz harness runs: `make fuzz FUZZ_SECONDS=600` for a longer hunt.
FUZZ_SECONDS := 20

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps check-deps install-missing build test test-unit demo bench sanitize tsan thread-safety fuzz format format-check clean

deps:
	@$(MAKE) --no-print-directory install-missing PACKAGES="$(DEBIAN_PACKAGES)"

check-deps: deps
	@$(MAKE) --no-print-directory install-missing PACKAGES="$(CHECK_PACKAGES)"

install-missing:
	@missing=$$(for p in $(PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "Installing build dependencies:" $$missing; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

build: deps
	cmake --preset release
	cmake --build --preset release -j $(JOBS)

test: build
	ctest --preset release -j $(JOBS)

# The unit tests alone (ctest labels: unit, integration, timing).
test-unit: build
	ctest --preset release -j $(JOBS) -L unit

demo: build
	examples/demo.sh $(BUILD_DIR)

bench: build
	bench/run.sh $(BUILD_DIR)
	bench/compute_sweep.sh $(BUILD_DIR)
	$(BUILD_DIR)/bench/bench_dra 2000
	bench/generated_table.sh $(BUILD_DIR)
	bench/mig_table.sh $(BUILD_DIR)

# ASan + UBSan over the host-side code, its unit and integration tests (the timing tests
# measure the wall clock, which instrumentation slows: they run in the release build).
sanitize: deps
	cmake --preset sanitize
	cmake --build --preset sanitize -j $(JOBS)
	ctest --preset sanitize -j $(JOBS)

# Clang's thread-safety analysis (-Wthread-safety, errors) over all of src/: compiled, not run.
thread-safety: check-deps
	cmake --preset thread-safety
	cmake --build --preset thread-safety -j $(JOBS)

# TSan over the extender, the node agent and their concurrency tests.
tsan: deps
	cmake --preset tsan
	cmake --build --preset tsan -j $(JOBS)
	ctest --preset tsan

# Every libFuzzer harness for FUZZ_SECONDS over its corpus (fuzz/corpus).
fuzz: check-deps
	cmake --preset fuzz -DTESSERA_FUZZ_SECONDS=$(FUZZ_SECONDS)
	cmake --build --preset fuzz -j $(JOBS)
	ctest --preset fuzz

format-check: check-deps
	find src tests bench examples scripts fuzz -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.inc' | xargs clang-format --dry-run -Werror

format:
	find src tests bench examples scripts fuzz -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.inc' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
