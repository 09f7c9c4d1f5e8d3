#!/usr/bin/env bash
# The rows × columns grid with its peers, on a GPU machine without Rust, from the repository
# root, using the bundle `cargo xtask device-bundle` packed into .gpu/:
#
#   bash bench/grid.sh [WHEELS_DIR]
#
# DTYPES (default "f32 bf16") names the element types to run, so that each can take a run of
# its own.
# Installs the peer wheels of WHEELS_DIR (default target/peer-wheels; see docs/benchmarking.md,
# "Peers") into a private folder, where a wheel too large to carry whole may come as pieces
# `NAME.whl.part-*` joined here first; runs `host bench --grid --peers`, isolated, for f32 and
# bf16 into bench/results/grid/<dtype>/; then draws the heatmaps beside each run's CSV. Logs go
# to $OUT (or ./device-out), with bench/results/grid packed as grid.tgz.
set -uo pipefail
wheels=${1:-target/peer-wheels}
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2

if [ -d "$wheels" ]; then
    site=$(mktemp -d)
    for first in "$wheels"/*.whl.part-aa; do
        [ -e "$first" ] || continue
        cat "${first%-aa}"-* > "${first%.part-aa}"
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$site" "$wheels"/*.whl > "$out/peer-wheels.txt" 2>&1 \
        || echo "grid: installing the peer wheels failed (see $out/peer-wheels.txt)" >&2
    # A folder on PYTHONPATH has its .pth files ignored, where site-packages would run them
    # (CUTLASS's DSL, which QuACK imports, puts itself on the path from one): a
    # sitecustomize there makes the folder a site directory.
    printf 'import os, site\nsite.addsitedir(os.path.dirname(os.path.abspath(__file__)))\n' \
        > "$site/sitecustomize.py"
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
else
    echo "grid: no $wheels: the peers are those python3 already has" >&2
fi

for dtype in ${DTYPES:-f32 bf16}; do
    variants=()
    [ "$dtype" = f32 ] && variants=(--variants auto)
    .gpu/host bench --grid --dtype "$dtype" "${variants[@]}" --timing isolated --peers \
        --out "bench/results/grid/$dtype" > "$out/grid-$dtype.txt" 2>&1
    echo "grid $dtype: exit $?"
    # The run's own CSV (the peers' rows are in it too), not the peers' separate copy.
    for csv in bench/results/grid/"$dtype"/*.csv; do
        case $(basename "$csv") in peers*) continue ;; esac
        python3 bench/grid_heatmap.py "$csv" "${csv%.csv}"
    done
done
tar czf "$out/grid.tgz" bench/results/grid
