#!/usr/bin/env bash
# The prepared GPU check of issue 36: profile a CUDA GPU through torch and time whole Llama-shaped steps on it,
# in under 8 minutes, everything written under $OUT (the device tool brings $OUT back).
#
#   bash tools/gpu_profile.sh                 # on the GPU machine: 310 s op profile + 90 s of whole steps
#   bash tools/gpu_profile.sh --dry-run       # here, on the CPU with torch installed: tiny shapes, about a minute
#
# PYTHON picks the interpreter (default python3: on the lent H200 machine the one that holds PyTorch).
# Budgets: PROFILE_S (default 310) for `python -m engine profile --backend torch --device cuda --full`,
# STEPS_S (default 90) for tools/gpu_step_profile.py, plus start-up (torch import, CUDA init) and each command's
# overrun past its budget (one shape at most): about 7 minutes. Each command is sent SIGINT 20 s (15 s) past its
# budget, which still writes what it measured (marked partial), and killed 10 s later: under 8 minutes at worst.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu_profile_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if [[ "${1:-}" == "--dry-run" ]]; then
  "$PYTHON" -m engine profile --backend torch --device cpu --tiny --budget-s 20 --name dry-run \
    --out "$OUT/dry-run-profile.json.gz" 2>&1 | tee "$OUT/profile.log"
  "$PYTHON" tools/gpu_step_profile.py --dry-run --budget-s 20 --out "$OUT/dry-run-steps.json.gz" 2>&1 \
    | tee "$OUT/steps.log"
  exit 0
fi

{ nvidia-smi || true; "$PYTHON" -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; } \
  > "$OUT/machine.txt" 2>&1
NAME=$("$PYTHON" - <<'EOF'
from engine.instruments.profiler import default_name, torch_backend
print(default_name(torch_backend("cuda")))
EOF
)
timeout -s INT -k 10 $(( ${PROFILE_S:-310} + 20 )) "$PYTHON" -m engine profile --backend torch --device cuda \
  --full --budget-s "${PROFILE_S:-310}" --out "$OUT/$NAME.json.gz" 2>&1 | tee "$OUT/profile.log" || true
timeout -s INT -k 10 $(( ${STEPS_S:-90} + 15 )) "$PYTHON" tools/gpu_step_profile.py --budget-s "${STEPS_S:-90}" \
  --out "$OUT/$NAME-steps.json.gz" 2>&1 | tee "$OUT/steps.log" || true
ls -la "$OUT"
