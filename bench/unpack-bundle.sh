#!/usr/bin/env bash
# On the GPU machine, from the repository root: unpacks .gpu/bundle.tar.gz (written by
# `cargo xtask device-bundle`) into .gpu/, unless it was unpacked already. bench/device-run.sh
# and bench/sanitize.sh call it first.
set -euo pipefail
bundle=.gpu/bundle.tar.gz
if [ ! -f "$bundle" ]; then
    echo "unpack-bundle: no $bundle (run \`cargo xtask device-bundle\` and copy .gpu/ here)" >&2
    exit 2
fi
if [ ! -x .gpu/host ] || [ "$bundle" -nt .gpu/host ]; then
    tar xzf "$bundle" -C .gpu
    # The binaries get back the kernel images the bundle keeps once.
    python3 bench/bundle_images.py unpack .gpu
    touch .gpu/host
fi
