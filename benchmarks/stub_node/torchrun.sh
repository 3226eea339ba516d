# torchrun for the scale harness's nodes (torch/distributed/run.py execs it): starts
# --nproc_per_node ranks of the command after --no-python, each with the variables torchrun
# gives a rank, and, as torchrun does, stops them all when one fails or a stop signal comes.
while [ $# -gt 0 ]; do
    case $1 in
        --nnodes=*) nnodes=${1#*=} ;;
        --node_rank=*) node_rank=${1#*=} ;;
        --nproc_per_node=*) nproc=${1#*=} ;;
        --master_addr=*) export MASTER_ADDR=${1#*=} ;;
        --master_port=*) export MASTER_PORT=${1#*=} ;;
        --no-python) shift; break ;;
    esac
    shift
done
export WORLD_SIZE=$((nnodes * nproc)) LOCAL_WORLD_SIZE=$nproc GROUP_RANK=$node_rank
export TORCHELASTIC_RUN_ID=harness
pids=()
for ((local = 0; local < nproc; local++)); do
    RANK=$((node_rank * nproc + local)) LOCAL_RANK=$local "$@" &
    pids+=($!)
done
stop() {
    kill -TERM "${pids[@]}" 2>/dev/null
    wait
    exit 143
}
trap stop TERM INT HUP
for ((n = 0; n < nproc; n++)); do
    wait -n
    rc=$?
    if ((rc != 0)); then
        kill -TERM "${pids[@]}" 2>/dev/null
        wait
        exit 1
    fi
done
