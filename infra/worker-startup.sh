#!/bin/bash
# Startup script of a TPU VM that `add-worker` creates (the node's `startup-script` metadata), rendered
# by ops.workers.startup_script: every double-braced NAME below is filled in from the registry.
#
# On every host of the slice it: installs the cluster image, reads the Ray token (never printed), finds
# the cluster's head by its labels, starts Ray inside the image with `ray start --address`, and then
# watches the head: when the head's address changes (a restart made a new head) or the raylet died, it
# stops Ray and joins the head there is now. So the same VM serves every head the cluster has.
#
# The node carries clusterbot-* labels and NOT Ray's ray-node-type labels, so Ray's autoscaler neither
# adopts nor deletes it; Ray itself detects the TPU chips and puts TPU-<type>-head on host 0.
set -uo pipefail
set +x  # the token must never reach the serial console or the logs

CLUSTER="{{CLUSTER}}"                    # the registry's short name
RAY_CLUSTER_NAME="{{RAY_CLUSTER_NAME}}"  # the head VM's ray-cluster-name label
PROJECT="{{PROJECT}}"
IMAGE="{{IMAGE}}"                        # <region>-docker.pkg.dev/<project>/<repo>/<name>:<tag>
CONTAINER=ray_worker
CHECK_EVERY_S=60
TOKEN_FILE=/etc/clusterbot/ray_auth_token

log() { echo "clusterbot-worker[$CLUSTER]: $*" | logger -t clusterbot-worker || true; echo "$*"; }

write_token() {
  # The token file until Secret Manager (the images-and-token issue); 0600, root only.
  install -d -m 0700 "$(dirname "$TOKEN_FILE")"
  umask 077
  cat > "$TOKEN_FILE" <<'CLUSTERBOT_TOKEN_EOF'
{{RAY_TOKEN}}
CLUSTERBOT_TOKEN_EOF
}

head_address() {
  # The head is the Compute Engine VM labelled as this cluster's Ray head (Ray's cluster launcher
  # labels it ray-cluster-name=<name>, ray-node-type=head).
  gcloud compute instances list --project "$PROJECT" \
    --filter="labels.ray-cluster-name=$RAY_CLUSTER_NAME AND labels.ray-node-type=head AND status=RUNNING" \
    --format="value(networkInterfaces[0].networkIP)" 2>/dev/null | head -n 1
}

install_image() {
  command -v docker >/dev/null || { curl -fsSL https://get.docker.com | sh; }
  gcloud auth configure-docker "${IMAGE%%/*}" --quiet >/dev/null 2>&1 || true
  until docker pull "$IMAGE" >/dev/null; do log "cannot pull $IMAGE yet; retrying"; sleep 30; done
}

start_ray() {
  local head="$1" auth=()
  if [ -s "$TOKEN_FILE" ]; then
    auth=(-e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH="$TOKEN_FILE" -v "$TOKEN_FILE:$TOKEN_FILE:ro")
  fi
  docker rm -f "$CONTAINER" >/dev/null 2>&1 || true
  docker run -d --name "$CONTAINER" --net=host --privileged --restart=on-failure \
    --ulimit memlock=-1:-1 --ulimit nofile=1048576:1048576 --shm-size=200gb -v /tmp:/tmp \
    -v /var/run/docker.sock:/var/run/docker.sock "${auth[@]}" \
    "$IMAGE" ray start --address="$head:6379" --block --disable-usage-stats >/dev/null
}

raylet_alive() { docker exec "$CONTAINER" ray status --address="$1:6379" >/dev/null 2>&1; }

main() {
  write_token
  install_image
  local joined=""
  while true; do
    local head
    head="$(head_address)"
    if [ -z "$head" ]; then
      log "no running head for $RAY_CLUSTER_NAME yet"
    elif [ "$head" != "$joined" ] || ! raylet_alive "$head"; then
      log "joining the head at $head (was: ${joined:-none})"
      start_ray "$head" && joined="$head"
    fi
    sleep "$CHECK_EVERY_S"
  done
}

main
