#!/usr/bin/env bash
# Builds liboxccl_nccl.so (host backend) and the C test program against its own nccl.h,
# checks that every function the header declares is exported, then runs the C test on the
# host backend (no GPU): life cycle, error codes, bad arguments, allreduce across forked
# processes and threads, grouped inits and calls from one thread, non-blocking inits,
# PreMulSum operators (2 and 3 processes, and their bad uses),
# forwarded calls without a real NCCL.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
LIB_DIR="$TARGET/debug"
cargo build -p oxccl-nccl-api
LIB="$LIB_DIR/liboxccl_nccl.so"
[ -f "$LIB" ] || { echo "nccl-api-test: $LIB was not built"; exit 1; }

# Every declared function (and its p-alias) must be exported.
exported=$(nm -D --defined-only "$LIB" | awk '{print $3}')
missing=0
for f in $(grep -o 'OXCCL_NCCL_DECLARE([^,]*, *nccl[A-Za-z]*' nccl-api/include/nccl.h | sed 's/.*, *//'); do
    for name in "$f" "p$f"; do
        grep -qx "$name" <<<"$exported" || { echo "nccl-api-test: $name is not exported"; missing=1; }
    done
done
[ $missing = 0 ] || exit 1
echo "nccl-api-test: every function of include/nccl.h is exported (with its pnccl alias)"

OUT="$TARGET/nccl-api-test"
mkdir -p "$OUT"
gcc -std=c11 -O1 -g -Wall -Wextra -Werror -Wno-unused-parameter \
    -I nccl-api/include nccl-api/tests/c/api_test.c \
    -L "$LIB_DIR" -loxccl_nccl -Wl,-rpath,"$LIB_DIR" -lpthread -lm -o "$OUT/api_test"
# Also as a C++ translation unit: the header must compile there too.
if command -v g++ >/dev/null; then
    echo '#include "nccl.h"
int main() { ncclConfig_t c = NCCL_CONFIG_INITIALIZER; return (int)c.blocking == 0; }' \
        | g++ -x c++ -std=c++17 -Wall -Werror -I nccl-api/include - -fsyntax-only
fi
OXCCL_BACKEND=host OXCCL_NCCL_LIB_PATH=/nonexistent/libnccl.so.2 timeout 300 "$OUT/api_test"
