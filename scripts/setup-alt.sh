#!/usr/bin/env bash
# The alternatives the spill and loaders benches compare against (litdata, mosaicml-streaming,
# webdataset) in their own environment, ./.venv-alt: mosaicml-streaming requires an older numpy
# than pyddstore's .venv has. .venv-alt sees .venv's packages (torch) behind its own (numpy, the
# loaders), so nothing is downloaded twice and .venv is left as it is. Run `bash scripts/setup.sh` first.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "run bash scripts/setup.sh first" >&2; exit 1; }
if [ ! -x .venv-alt/bin/python ]; then
    echo "==> python venv .venv-alt"
    "$(readlink -f .venv/bin/python)" -m venv .venv-alt
    # .venv's packages (torch and the rest) after .venv-alt's own
    .venv/bin/python -c "import sys; print('\\n'.join(p for p in sys.path if p.endswith('-packages')))" \
        >"$(.venv-alt/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/main-venv.pth"
fi
.venv-alt/bin/python -m pip install -q --no-cache-dir litdata mosaicml-streaming webdataset
.venv-alt/bin/python -c "import litdata, streaming, torch, numpy; print('litdata', litdata.__version__, 'streaming', streaming.__version__, 'numpy', numpy.__version__, 'ready')"
