"""Nothing assumes x86: every kernel's plain-C path must compile for arm64.

A cross compiler (Debian's gcc-aarch64-linux-gnu, which `make test` installs when
it can) compiles each kernels_c/*.c to an object file with the generic level's
flags. Without one the test is skipped, visibly.
"""

import hashlib
import shutil
import subprocess

import pytest

from smallem.plumbing import build

CROSS = shutil.which("aarch64-linux-gnu-gcc")


@pytest.mark.skipif(CROSS is None, reason="no aarch64-linux-gnu-gcc (apt install gcc-aarch64-linux-gnu)")
@pytest.mark.parametrize("name", build.kernel_names())
def test_generic_path_compiles_for_arm64(name, tmp_path):
    src = build.KERNELS_DIR / f"{name}.c"
    flags = [*build.BASE_FLAGS, "-fopenmp", "-Werror", f"-I{build.KERNELS_DIR}", "-c"]
    # A success is kept as the CUDA checks are: under the sources (the file and everything it
    # includes), the cross compiler's identity and the flags; an unchanged kernel is not
    # compiled again. Failures are never kept.
    _, deps = build._sources(name)
    key = hashlib.sha256("\0".join([build.file_identity(CROSS), *flags]).encode()
                         + b"".join(hashlib.sha256(p.read_bytes()).digest() for p in [src, *deps]))
    stamp = build.cache_dir() / "arm64-checked" / key.hexdigest()[:32]
    if stamp.is_file():
        return
    r = subprocess.run([CROSS, *flags, str(src), "-o", str(tmp_path / f"{name}.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"{src} does not build for arm64:\n{r.stderr}"
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.touch()
