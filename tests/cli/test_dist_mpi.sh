#!/usr/bin/env bash
# The mpi backend under mpirun (1 to 4 ranks, oversubscribed), auto selection
# under mpirun, and our shm/tcp backends launched by mpirun (OMPI_* variables
# plus --master): every collective checked against the reference.
set -u
b=${DT_BUILD_DIR:?}
command -v mpirun >/dev/null || { echo "skip: mpirun not installed (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
nm -D "$b/libdtrain.so" | grep -q " U MPI_Init" || { echo "skip: libdtrain was built without MPI"; exit 77; }
fail=0
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
run() { # ranks backend expected-backend [worker flags]
  local out rc try
  # The port is free when chosen but not reserved: a test running beside this one can take it before rank 0
  # listens ("address already in use"), so that one failure is retried on another port.
  for try in 1 2 3; do
    out=$(timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -n "$1" \
          -x OMP_NUM_THREADS=1 -x DT_TIMEOUT=60 \
          "$b/tests/dist_worker" --backend "$2" --master "127.0.0.1:$(port)" --expect-backend "$3" "${@:4}" 2>&1)
    rc=$?
    grep -q "address already in use" <<<"$out" || break
  done
  local ok
  ok=$(grep -c "backend $3: .* 0 failed" <<<"$out")
  if [ $rc -ne 0 ] || [ "$ok" -ne "$1" ]; then
    echo "FAIL: mpirun -n $1 --backend $2 (rc $rc, $ok of $1 ranks ok)"; echo "$out" | tail -20; fail=1
  else
    echo "ok   mpirun -n $1 --backend $2 -> $3"
  fi
}
for n in 1 2 4; do run $n mpi mpi; done
run 3 mpi mpi --large
run 3 auto mpi
run 2 shm shm
run 3 tcp tcp
exit $fail
