#!/usr/bin/env bash
# The last step of a sharded run: wait for the Job to finish, read every shard's report from
# its pod's log and merge them into one: merged.json, and the summary on the terminal.
#   deploy/merge.sh JOB [TIMEOUT]        e.g. deploy/merge.sh flowlane-gen 15m
# Needs kubectl (pointed at the cluster) and flowlane on this machine. Exit: flowlane merge's
# (0 ok, 1 a shard reported a problem or is missing, 2 reports that are not one run's).
set -euo pipefail
job=${1:?usage: merge.sh JOB [TIMEOUT]}
timeout=${2:-30m}
command -v kubectl >/dev/null || { echo "merge.sh: kubectl is not installed" >&2; exit 2; }
command -v flowlane >/dev/null || { echo "merge.sh: flowlane is not on PATH" >&2; exit 2; }
# A shard that failed still printed its report (its problems in it): merge it with the others,
# and a missing one is named by merge.
kubectl wait --for=condition=complete --timeout="$timeout" "job/$job" \
    || echo "merge.sh: job $job did not complete; merging what its pods reported" >&2
logs=$(mktemp)
trap 'rm -f "$logs"' EXIT
for p in $(kubectl get pods --selector "job-name=$job" -o name); do
    # kubectl mixes a pod's standard error (status lines) into its log: merge passes over
    # lines outside the reports and says how many.
    kubectl logs "$p" >> "$logs"
done
status=0
flowlane merge "$logs" --json > merged.json || status=$?
flowlane merge "$logs" || true
echo "merged report: merged.json"
exit "$status"
