# A termux-packages recipe for DualPath, built from a local checkout.
#
#   mkdir termux-packages/packages/dualpath
#   cp android/termux/build.sh termux-packages/packages/dualpath/
#   DUALPATH_SRCDIR=/path/to/dualpath ./build-package.sh dualpath    # in termux-packages
#
# In termux-packages' Docker builder the checkout must be reachable inside the container
# (under termux-packages/, which is mounted at /home/builder/termux-packages). On a phone,
# ./build-package.sh -I dualpath builds it on the device. When DualPath publishes release
# tarballs, TERMUX_PKG_SRCURL becomes the tarball's https URL and TERMUX_PKG_SHA256 its hash.
#
# The pure-Python dependencies (gguf, pyyaml, jinja2) are pip-installed when the package is
# installed (TERMUX_PKG_PYTHON_RUNTIME_DEPS). tokenizers (Rust) and onnx (C++, cmake,
# protobuf) are left out: see android/README.md for what works without them.
# A placeholder until the project has a public home page.
TERMUX_PKG_HOMEPAGE=https://github.com/dualpath/dualpath
TERMUX_PKG_DESCRIPTION="On-device LLM inference on the CPU: ONNX Runtime, a dual-path KV cache, SIMD attention"
TERMUX_PKG_LICENSE="MIT"
TERMUX_PKG_MAINTAINER="DualPath developers"
TERMUX_PKG_VERSION="0.1.0"
TERMUX_PKG_SRCURL="file://${DUALPATH_SRCDIR:-/home/builder/termux-packages/dualpath-src}"
TERMUX_PKG_SHA256=SKIP_CHECKSUM
TERMUX_PKG_DEPENDS="python, python-numpy, python-onnxruntime, python-pip"
TERMUX_PKG_SETUP_PYTHON=true
TERMUX_PKG_PYTHON_COMMON_BUILD_DEPS="'Cython>=3.0', setuptools, wheel"
_NUMPY_VERSION=$(. "$TERMUX_SCRIPTDIR"/packages/python-numpy/build.sh; echo "$TERMUX_PKG_VERSION")
TERMUX_PKG_PYTHON_CROSS_BUILD_DEPS="'numpy==$_NUMPY_VERSION'"
TERMUX_PKG_PYTHON_RUNTIME_DEPS="'gguf>=0.17', 'pyyaml>=6.0', 'jinja2>=3.1'"
TERMUX_PKG_BUILD_IN_SRC=true
TERMUX_PKG_AUTO_UPDATE=false

termux_step_pre_configure() {
	# setup.py picks its SIMD kernel files by the target's architecture, not the build
	# machine's: NEON and NEON-FP16 on aarch64, AVX2/AVX-512 on x86_64, generic C otherwise.
	export DUALPATH_TARGET_MACHINE="$TERMUX_ARCH"
	# In a cross build numpy.get_include() is the build side's numpy; put the target's
	# headers first.
	CPPFLAGS+=" -I$TERMUX_PYTHON_HOME/site-packages/numpy/_core/include"
}

termux_step_make() {
	:
}

termux_step_make_install() {
	# --no-deps: numpy and onnxruntime are the Termux packages above, the pure-Python
	# dependencies come with the postinst script.
	pip install . --prefix="$TERMUX_PREFIX" --no-build-isolation --no-deps
}
