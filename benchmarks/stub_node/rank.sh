# The scale harness's rank program (the stub python runs a .sh file with bash): stamps its
# start as `rankR TIME` in STAMPS, says it started, then either sleeps until it is stopped
# (`idle`) or prints `line I of rank R` once a second for SECONDS and ends (`lines`).
#     rank.sh STAMPS idle | rank.sh STAMPS lines SECONDS
stamps=$1 mode=$2
printf 'rank%s %s\n' "$RANK" "$EPOCHREALTIME" >>"$stamps"
printf 'rank %s started\n' "$RANK"
if [ "$mode" = lines ]; then
    # A tick without a process per second: a read that times out on a FIFO nobody writes.
    tick=$(mktemp -u) && mkfifo "$tick" && exec 9<>"$tick" && rm -f "$tick"
    for ((i = 1; i <= $3; i++)); do
        read -r -t 1 -u 9
        printf 'line %d of rank %s\n' "$i" "$RANK"
    done
    exit 0
fi
exec sleep infinity
