# Tessera: `make demo` and `make test` work on a fresh Debian 12 machine; they install the
# build dependencies they find missing (apt-get, as root or through sudo).
BUILD_DIR := build
JOBS := $(shell nproc)

# Every Debian package the build and the tests need.
DEBIAN_PACKAGES := cmake make g++ pkg-config python3 \
  libgtest-dev libgmock-dev libbenchmark-dev \
  libcli11-dev libfmt-dev nlohmann-json3-dev libcpp-httplib-dev libcurl4-openssl-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps build test demo bench format clean

deps:
	@missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "Installing build dependencies:" $$missing; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

build: deps
	cmake --preset release
	cmake --build --preset release -j $(JOBS)

test: build
	ctest --preset release -j $(JOBS)

demo: build
	examples/demo.sh $(BUILD_DIR)

bench: build
	bench/run.sh $(BUILD_DIR)
	bench/compute_sweep.sh $(BUILD_DIR)

format:
	find src tests bench examples scripts -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.inc' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
