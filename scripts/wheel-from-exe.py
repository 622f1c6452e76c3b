#!/usr/bin/env python3
"""Builds a binary-only wheel (`py3-none-<platform>`) around a prebuilt
executable, with the same layout and metadata as the wheel maturin builds.

maturin cannot package a prebuilt binary: it always runs `cargo build` for
the target itself, and the Windows build here is made outside cargo's normal
toolchain (Debian's rustc-web with -Zbuild-std and mingw). A wheel is a zip
(PEP 427): `<name>-<ver>.data/scripts/<exe>` is installed onto the venv's
PATH (Scripts\\ on Windows), and `<name>-<ver>.dist-info/` holds METADATA,
WHEEL and RECORD (every file's urlsafe-base64 sha256 and size).

    wheel-from-exe.py --exe path/to/reshard.exe --as reshard.exe --tag py3-none-win_amd64 \
        --like dist/reshard-0.1.0-py3-none-manylinux_2_34_x86_64.whl --out dist

METADATA and the license files are taken from the --like wheel (maturin's
build of the same version), so the two wheels describe the same project;
its SBOM is not (it lists the Linux build's dependencies).
Only the standard library is used.
"""

import argparse
import base64
import hashlib
import os
import re
import sys
import zipfile

# Zip entries get this fixed time, as maturin's do, so builds are reproducible.
EPOCH = (1980, 1, 1, 0, 0, 0)


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"{path},sha256={digest.decode()},{len(data)}"


def add(zf, path, data, mode):
    info = zipfile.ZipInfo(path, date_time=EPOCH)
    info.external_attr = (mode & 0xFFFF) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exe", required=True, help="the prebuilt executable")
    ap.add_argument("--as", dest="script", help="its name on PATH (default: the file's name)")
    ap.add_argument("--tag", required=True, help="wheel tag, e.g. py3-none-win_amd64")
    ap.add_argument("--like", required=True, help="a wheel of the same project and version")
    ap.add_argument("--out", required=True, help="folder to write the wheel into")
    args = ap.parse_args()

    if not re.fullmatch(r"py3-none-[a-z0-9_]+", args.tag):
        sys.exit(f"error: {args.tag!r} is not a py3-none-<platform> tag")
    with zipfile.ZipFile(args.like) as like:
        dist_info = sorted({n.split("/")[0] for n in like.namelist() if ".dist-info/" in n})
        if len(dist_info) != 1:
            sys.exit(f"error: {args.like}: expected one .dist-info folder, found {dist_info}")
        dist_info = dist_info[0]
        name_ver = dist_info[: -len(".dist-info")]
        kept = {
            n: like.read(n)
            for n in like.namelist()
            if n.startswith(dist_info + "/")
            and n not in (f"{dist_info}/WHEEL", f"{dist_info}/RECORD")
            # maturin's SBOM lists the Linux build's dependencies: not this one's.
            and not n.startswith(f"{dist_info}/sboms/")
        }
    if f"{dist_info}/METADATA" not in kept:
        sys.exit(f"error: {args.like}: no METADATA")

    with open(args.exe, "rb") as f:
        exe = f.read()
    exe_name = args.script or os.path.basename(args.exe)
    if "/" in exe_name or "\\" in exe_name or exe_name in ("", ".", ".."):
        sys.exit(f"error: {exe_name!r} is not a file name")
    wheel_meta = (
        "Wheel-Version: 1.0\n"
        "Generator: reshard scripts/wheel-from-exe.py\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {args.tag}\n"
    ).encode()
    files = [(f"{name_ver}.data/scripts/{exe_name}", exe, 0o755)]
    files += [(n, data, 0o644) for n, data in sorted(kept.items())]
    files.append((f"{dist_info}/WHEEL", wheel_meta, 0o644))
    record = "\n".join([record_line(p, d) for p, d, _ in files] + [f"{dist_info}/RECORD,,", ""])

    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"{name_ver}-{args.tag}.whl")
    tmp = out + ".tmp"
    with zipfile.ZipFile(tmp, "w") as zf:
        for path, data, mode in files:
            add(zf, path, data, mode)
        add(zf, f"{dist_info}/RECORD", record.encode(), 0o644)
    os.replace(tmp, out)
    print(out)


if __name__ == "__main__":
    main()
