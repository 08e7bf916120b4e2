#!/usr/bin/env bash
# The peers' own environment for bench_stream_peers.py (never packfmt's dependencies): MosaicML Streaming 0.13 needs
# numpy < 2.2 and imports torchvision at import time; PyPI's torchvision does not import beside the torch 2.13.0 file
# this machine offers, so torch 2.14.1 with torchvision 0.29.1 (both on this disk for Python 3.11 on x86_64;
# /work/.library/env/machines/python.md; on aarch64: torch==2.9.1 torchvision==0.24.1). moto and s3fs: not needed.
#     bash benchmarks/peers_env.sh /work/peers-venv        # then: bench_stream_peers.py --peers-python DIR/bin/python
set -eu
DIR=${1:?usage: bash benchmarks/peers_env.sh DIR}
python3 -m venv "$DIR"
"$DIR/bin/pip" install -q --disable-pip-version-check torch==2.14.1 torchvision==0.29.1
"$DIR/bin/pip" install -q --disable-pip-version-check 'mosaicml-streaming==0.13.*' 'numpy<2.2' litdata==0.2.76 obstore boto3
"$DIR/bin/python" -c "import streaming, litdata, numpy; print('streaming', streaming.__version__, 'litdata', \
litdata.__version__, 'numpy', numpy.__version__)"
