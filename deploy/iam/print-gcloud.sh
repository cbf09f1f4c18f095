#!/usr/bin/env bash
# Print (never run) the gcloud commands that give the Falcon-Ray controller access to its
# edge projects. Review the output, then run it: deploy/iam/print-gcloud.sh | bash -eux
#
#   CENTRAL_PROJECT=tpu-service-473302 CENTRAL_PROJECT_NUMBER=123456789012 \
#   EDGE_PROJECTS="poc-tpu-partner other-edge" deploy/iam/print-gcloud.sh
#
# Edge projects may also be given as arguments. Optional settings:
#   GSA            use an annotated Google service account (deploy/kuberay-gsa) instead
#                  of the direct Workload Identity principal, e.g.
#                  falcon-controller@CENTRAL_PROJECT.iam.gserviceaccount.com
#   LOG_BUCKETS    "EDGE_PROJECT=BUCKET ..." pairs: grant the Jobs' service account
#                  roles/storage.objectUser on each cluster's log bucket
#   NODE_SERVICE_ACCOUNT  service account of the nodes Falcon creates (default: each
#                  edge project's Compute Engine default service account)
#   NAMESPACE / KSA           controller identity (default falcon / falcon-controller)
#   JOB_NAMESPACE / JOB_KSA   Jobs' identity (default falcon-jobs / falcon-job)
#   ROLE_ID                   custom role id (default falconController)
#
# Adding a cluster stays "IAM plus one row": run this for a new edge project (the
# commands are idempotent except `roles create`, see the note it prints), then
# `falcon-ray clusters add ...`. A new cluster in an edge project that is already set up
# needs only the row (and the one-time cluster preparation printed at the end).
set -euo pipefail

usage() {
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit "${1:-2}"
}

die() {
    echo "print-gcloud.sh: $*" >&2
    exit 2
}

CENTRAL_PROJECT="${CENTRAL_PROJECT:-}"
CENTRAL_PROJECT_NUMBER="${CENTRAL_PROJECT_NUMBER:-}"
NAMESPACE="${NAMESPACE:-falcon}"
KSA="${KSA:-falcon-controller}"
JOB_NAMESPACE="${JOB_NAMESPACE:-falcon-jobs}"
JOB_KSA="${JOB_KSA:-falcon-job}"
ROLE_ID="${ROLE_ID:-falconController}"
GSA="${GSA:-}"
LOG_BUCKETS="${LOG_BUCKETS:-}"
NODE_SERVICE_ACCOUNT="${NODE_SERVICE_ACCOUNT:-}"
ROLE_FILE="$(dirname "$0")/falcon-controller-role.yaml"

case "${1:-}" in -h | --help) usage 0 ;; esac
edges=()
if [ "$#" -gt 0 ]; then
    edges=("$@")
else
    read -r -a edges <<<"${EDGE_PROJECTS:-}"
fi

project_re='^[a-z][a-z0-9-]{4,28}[a-z0-9]$'
[ -n "$CENTRAL_PROJECT" ] || die "set CENTRAL_PROJECT (the central project's id)"
[[ "$CENTRAL_PROJECT" =~ $project_re ]] || die "CENTRAL_PROJECT '$CENTRAL_PROJECT' is not a project id"
[[ "$CENTRAL_PROJECT_NUMBER" =~ ^[0-9]+$ ]] || die "set CENTRAL_PROJECT_NUMBER (digits; gcloud projects describe $CENTRAL_PROJECT --format='value(projectNumber)')"
[ "${#edges[@]}" -gt 0 ] || die "give the edge projects in EDGE_PROJECTS or as arguments"
for p in "${edges[@]}"; do
    [[ "$p" =~ $project_re ]] || die "edge project '$p' is not a project id"
done
[[ "$ROLE_ID" =~ ^[a-zA-Z0-9_.]{3,64}$ ]] || die "ROLE_ID '$ROLE_ID' is not a custom role id"
if [ -n "$GSA" ]; then
    [[ "$GSA" =~ ^[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9-]{4,28}[a-z0-9]\.iam\.gserviceaccount\.com$ ]] ||
        die "GSA '$GSA' is not a user-managed service account email"
fi

principal="principal://iam.googleapis.com/projects/${CENTRAL_PROJECT_NUMBER}/locations/global/workloadIdentityPools/${CENTRAL_PROJECT}.svc.id.goog/subject/ns/${NAMESPACE}/sa/${KSA}"
if [ -n "$GSA" ]; then
    member="serviceAccount:${GSA}"
else
    member="$principal"
fi

bucket_for() {
    local pair
    for pair in $LOG_BUCKETS; do
        if [ "${pair%%=*}" = "$1" ]; then
            echo "${pair#*=}"
            return
        fi
    done
}

echo "# Falcon-Ray IAM for central project ${CENTRAL_PROJECT} (${CENTRAL_PROJECT_NUMBER})"
echo "# Printed by deploy/iam/print-gcloud.sh; nothing has been run."
echo "#"
echo "# Prerequisite in the central cluster: Workload Identity Federation for GKE"
echo "# (workload pool ${CENTRAL_PROJECT}.svc.id.goog, node pools with GKE_METADATA)."
if [ -n "$GSA" ]; then
    gsa_name="${GSA%%@*}"
    gsa_project="${GSA#*@}"
    gsa_project="${gsa_project%%.iam.gserviceaccount.com}"
    echo "# Controller identity: Google service account ${GSA}, impersonated by the"
    echo "# Kubernetes service account ${NAMESPACE}/${KSA} (deploy/kuberay-gsa)."
    echo "# (skip the create if the service account exists)"
    echo "gcloud iam service-accounts create ${gsa_name} --project=${gsa_project} --display-name='Falcon-Ray controller'"
    echo "gcloud iam service-accounts add-iam-policy-binding ${GSA} --project=${gsa_project} \\"
    echo "    --role=roles/iam.workloadIdentityUser \\"
    echo "    --member='serviceAccount:${CENTRAL_PROJECT}.svc.id.goog[${NAMESPACE}/${KSA}]'"
else
    echo "# Controller identity: the Kubernetes service account ${NAMESPACE}/${KSA} itself"
    echo "# (direct principal, no Google service account, no annotation):"
    echo "#   ${principal}"
fi

for edge in "${edges[@]}"; do
    echo
    echo "# ---- edge project ${edge}"
    echo "EDGE_NUMBER=\$(gcloud projects describe ${edge} --format='value(projectNumber)')"
    echo "# The custom role (already exists? use: gcloud iam roles update ${ROLE_ID} --project=${edge} --file=${ROLE_FILE} --quiet)"
    echo "gcloud iam roles create ${ROLE_ID} --project=${edge} --file=${ROLE_FILE}"
    echo "gcloud projects add-iam-policy-binding ${edge} --condition=None \\"
    echo "    --role=projects/${edge}/roles/${ROLE_ID} \\"
    echo "    --member='${member}'"
    echo "# Creating a node pool attaches the nodes' service account; GKE requires the caller to"
    echo "# be allowed to act as it. Granted on that one account, not project-wide."
    if [ -n "$NODE_SERVICE_ACCOUNT" ]; then
        node_sa="$NODE_SERVICE_ACCOUNT"
    else
        node_sa="\${EDGE_NUMBER}-compute@developer.gserviceaccount.com"
    fi
    echo "gcloud iam service-accounts add-iam-policy-binding \"${node_sa}\" --project=${edge} \\"
    echo "    --role=roles/iam.serviceAccountUser \\"
    echo "    --member='${member}'"
    job_principal="principal://iam.googleapis.com/projects/\${EDGE_NUMBER}/locations/global/workloadIdentityPools/${edge}.svc.id.goog/subject/ns/${JOB_NAMESPACE}/sa/${JOB_KSA}"
    bucket="$(bucket_for "$edge")"
    echo "# The Jobs write their logs through GCS FUSE as ${JOB_NAMESPACE}/${JOB_KSA} of the edge"
    echo "# cluster (the edge project's workload pool, not the central one)."
    if [ -n "$bucket" ]; then
        echo "gcloud storage buckets add-iam-policy-binding gs://${bucket#gs://} \\"
        echo "    --role=roles/storage.objectUser \\"
        echo "    --member=\"${job_principal}\""
    else
        echo "# gcloud storage buckets add-iam-policy-binding gs://LOG_BUCKET \\"
        echo "#     --role=roles/storage.objectUser \\"
        echo "#     --member=\"${job_principal}\""
        echo "# (set LOG_BUCKETS=\"${edge}=LOG_BUCKET\" to print it as a command)"
    fi
done

cat <<EOF

# ---- once per edge cluster (CLUSTER, LOCATION, EDGE_PROJECT: yours)
# Workload Identity and the GCS FUSE CSI driver on the cluster:
#   gcloud container clusters update CLUSTER --location=LOCATION --project=EDGE_PROJECT --workload-pool=EDGE_PROJECT.svc.id.goog
#   gcloud container clusters update CLUSTER --location=LOCATION --project=EDGE_PROJECT --update-addons=GcsFuseCsiDriver=ENABLED
# Falcon's own node pools are created with workloadMetadataConfig GKE_METADATA (render.py);
# other pools that should use Workload Identity need --workload-metadata=GKE_METADATA.
# The Jobs' namespace and service account (Falcon does not create them):
#   kubectl create namespace ${JOB_NAMESPACE}
#   kubectl -n ${JOB_NAMESPACE} create serviceaccount ${JOB_KSA}
# Then the one row:
#   falcon-ray clusters add CLUSTER --project EDGE_PROJECT --location LOCATION --tpu-type v6e|v7x \\
#       --gcs-bucket LOG_BUCKET [--reservation NAME] --namespace ${JOB_NAMESPACE} --service-account ${JOB_KSA}
EOF
