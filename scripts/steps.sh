# Sourced by scripts/run.sh and scripts/test.sh. Each long step (venv, pip, pytest, flwr run) runs
# as `step CMD ARGS...`: in a process group of its own, with this script waiting on it. Then a stop
# of the script reaches the step: bash runs no trap until a foreground command has ended, and a
# signal sent to the script alone (`kill PID`, a supervisor's SIGTERM) never reaches its children,
# so without this a stop during `pip install` or `pytest` left that process running.
#
#   step CMD ARGS...        runs CMD in its own session and returns its exit status
#   stop_step SIGNAL SECS   (in a trap) sends SIGNAL to the running step's process group, waits
#                           for the whole group to end, and SIGKILLs what is left after SECS
#   stop_on_signals NAME SECS [CLEANUP]
#                           on Ctrl-C, SIGTERM and SIGHUP: stop_step TERM SECS, run CLEANUP,
#                           print "NAME: stopped by SIG...", exit 128 + n (no EXIT trap after)
#
# bash starts an asynchronous command with SIGINT and SIGQUIT ignored, and an ignored signal stays
# ignored through exec (Python then installs no KeyboardInterrupt handler, a bash script can trap
# no Ctrl-C, and the tests that send SIGINT would see it ignored): a step gets them back.

STEP=""  # the process group (the session leader's PID) of the step running now

step() {
    (trap - INT QUIT; exec setsid "$@") &
    STEP=$!
    local rc=0
    wait "$STEP" || rc=$?
    STEP=""
    return "$rc"
}

stop_step() {
    [ -n "$STEP" ] || return 0
    local group=$STEP end=$((SECONDS + $2)) stat
    STEP=""
    kill -"$1" -- "-$group" 2>/dev/null || true
    while kill -0 -- "-$group" 2>/dev/null; do  # a process of the group is left
        stat=$(cat "/proc/$group/stat" 2>/dev/null) || stat=""
        stat=${stat##*) }
        if [ "${stat%% *}" = Z ]; then  # the leader has ended: reap it (a zombie counts as a member)
            wait "$group" 2>/dev/null || true
            continue
        fi
        [ "$SECONDS" -lt "$end" ] || kill -KILL -- "-$group" 2>/dev/null || true
        sleep 0.1
    done
    wait "$group" 2>/dev/null || true
}

stop_on_signals() {
    STOP_NAME=$1 STOP_SECS=$2 STOP_CLEANUP=${3:-}
    trap '_stopped INT 2' INT
    trap '_stopped TERM 15' TERM
    trap '_stopped HUP 1' HUP
}

_stopped() {  # $1: the signal's name, $2: its number
    trap '' INT TERM HUP
    trap - EXIT
    stop_step TERM "$STOP_SECS"
    [ -z "$STOP_CLEANUP" ] || "$STOP_CLEANUP"
    echo "$STOP_NAME: stopped by SIG$1: every process it started is stopped" >&2
    exit $((128 + $2))
}
