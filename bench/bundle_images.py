#!/usr/bin/env python3
"""Keeps each embedded kernel image once in the GPU bundle.

Every binary of the bundle embeds the same PTX and cubins (tens of MB each). `pack DIR
IMAGES` cuts every copy of every file of IMAGES out of the binaries under DIR and notes where
it was in `<binary>.images`; `unpack DIR` puts them back. `cargo xtask device-bundle` packs,
bench/unpack-bundle.sh unpacks (on the GPU machine, which has Python but no Rust).
"""

import json
import os
import sys


def binaries(root, skip):
    for folder, _, files in os.walk(root):
        if os.path.abspath(folder) == os.path.abspath(skip):
            continue
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not name.endswith(".images") and os.access(path, os.X_OK):
                yield path


def pack(root, images_dir):
    images = {}
    for name in sorted(os.listdir(images_dir)):
        with open(os.path.join(images_dir, name), "rb") as f:
            images[name] = f.read()
    # Largest first, so no image is found inside a bigger one's copy.
    order = sorted(images, key=lambda n: -len(images[n]))
    saved = 0
    for path in binaries(root, images_dir):
        with open(path, "rb") as f:
            data = f.read()
        cuts = []
        for name in order:
            blob, start = images[name], 0
            while (at := data.find(blob, start)) >= 0:
                if not any(a < at + len(blob) and at < a + len(images[n]) for a, n in cuts):
                    cuts.append((at, name))
                start = at + 1
        if not cuts:
            continue
        cuts.sort()
        pieces, last = [], 0
        for at, name in cuts:
            pieces.append(data[last:at])
            last = at + len(images[name])
        pieces.append(data[last:])
        mode = os.stat(path).st_mode
        with open(path, "wb") as f:
            f.write(b"".join(pieces))
        os.chmod(path, mode)
        with open(path + ".images", "w") as f:
            json.dump({"images": os.path.relpath(images_dir, os.path.dirname(path)),
                       "cuts": cuts}, f)
        saved += sum(len(images[n]) for _, n in cuts)
    print(f"bundle: {saved / 2**20:.0f} MiB of embedded images kept once in {images_dir}")


def unpack(root):
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".images"):
                continue
            manifest = os.path.join(folder, name)
            path = manifest[: -len(".images")]
            with open(manifest) as f:
                table = json.load(f)
            with open(path, "rb") as f:
                data = f.read()
            images_dir = os.path.join(folder, table["images"])
            # The skeleton holds everything but the cut images, in order.
            rebuilt, skeleton_at, original_at = [], 0, 0
            for at, image in table["cuts"]:
                with open(os.path.join(images_dir, image), "rb") as f:
                    blob = f.read()
                gap = at - original_at
                rebuilt.append(data[skeleton_at: skeleton_at + gap])
                rebuilt.append(blob)
                skeleton_at += gap
                original_at = at + len(blob)
            rebuilt.append(data[skeleton_at:])
            mode = os.stat(path).st_mode
            with open(path, "wb") as f:
                f.write(b"".join(rebuilt))
            os.chmod(path, mode)
            os.remove(manifest)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "pack":
        pack(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "unpack":
        unpack(sys.argv[2])
    else:
        sys.exit("usage: bundle_images.py pack DIR IMAGES | unpack DIR")
