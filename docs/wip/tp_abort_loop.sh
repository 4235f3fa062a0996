#!/usr/bin/env bash
# Runs the env:// rendezvous test until rank 0 aborts at exit (the rare "terminate called
# without an active exception"), keeping its core for gdb: from the repo root,
#   N=150 bash docs/wip/tp_abort_loop.sh      # ~6 s a run; 1 in ~75-150 aborted at stop 74
# then `gdb python3 core` and `thread apply all bt`. Needs core_pattern "core" (cwd).
ulimit -c unlimited
export PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
for i in $(seq 1 "${N:-100}"); do
  rm -f core
  timeout 200 python3 -m pytest -q -p no:cacheprovider \
    tests/test_tensor_parallel.py::test_env_rendezvous_two_processes > /tmp/tp_abort_$i.log 2>&1
  rc=$?
  echo "run $i rc=$rc"
  if [ $rc -ne 0 ]; then echo "log: /tmp/tp_abort_$i.log"; ls -la core 2>/dev/null; break; fi
done
