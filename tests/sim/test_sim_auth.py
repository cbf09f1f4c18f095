"""Workload Identity through the simulated metadata server, and bearer-token checks on every API."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import google.auth
import google.auth.credentials
import google.auth.transport.requests
import pytest
from google.api_core import exceptions as gexc
from google.auth import compute_engine
from google.auth.credentials import AnonymousCredentials
from kubernetes import client as k8s

from tests.harness.sim import compute_client, gke_client, google_credentials, kube_api_client

A_CLUSTER = "projects/proj-sim-a/locations/us-east5-b/clusters/sim-a"
K_CLUSTER = "projects/proj-sim-k/locations/europe-west4-a/clusters/sim-k"


def metadata_get(fleet, path, flavor=True):
    req = urllib.request.Request(f"http://{fleet.endpoints['metadata']}{path}")
    if flavor:
        req.add_header("Metadata-Flavor", "Google")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def test_google_auth_default_resolves_to_the_sim_metadata_server(sim):
    credentials, project = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    assert isinstance(credentials, compute_engine.Credentials)
    assert project == sim.config.metadata.project_id
    before = sim.stats()["tokens_issued"]
    credentials.refresh(google.auth.transport.requests.Request())
    assert credentials.valid and credentials.token.startswith("ya29.sim-")
    assert credentials.service_account_email == sim.config.metadata.service_account
    assert sim.stats()["tokens_issued"] == before + 1
    # the token it got is accepted by the GKE API
    assert gke_client(sim, credentials=credentials).get_cluster(name=A_CLUSTER).name == "sim-a"


def test_metadata_server_speaks_like_gce(sim):
    status, headers, body = metadata_get(sim, "/")
    assert status == 200 and headers["Metadata-Flavor"] == "Google"
    status, _, body = metadata_get(sim, "/computeMetadata/v1/project/project-id")
    assert status == 200 and body == sim.config.metadata.project_id
    status, _, _ = metadata_get(sim, "/computeMetadata/v1/project/project-id", flavor=False)
    assert status == 403
    status, headers, body = metadata_get(
        sim, "/computeMetadata/v1/instance/service-accounts/default/?recursive=true"
    )
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(body)["email"] == sim.config.metadata.service_account
    status, _, body = metadata_get(sim, "/computeMetadata/v1/instance/service-accounts/default/token")
    token = json.loads(body)
    assert token["token_type"] == "Bearer" and token["expires_in"] == 3600 and token["access_token"]
    status, _, _ = metadata_get(sim, "/computeMetadata/v1/instance/service-accounts/other@x.iam/token")
    assert status == 404
    status, _, body = metadata_get(
        sim, "/computeMetadata/v1/instance/service-accounts/default/identity?audience=a"
    )
    assert status == 200 and body.count(".") == 2


class ForgedCredentials(google.auth.credentials.Credentials):
    """Credentials whose every token is one the simulator never issued."""

    def refresh(self, request):
        self.token = "ya29.forged"


def test_missing_or_unknown_tokens_get_401_on_every_api(sim):
    forged = ForgedCredentials()
    with pytest.raises(gexc.Unauthorized) as err:
        gke_client(sim, credentials=forged).get_cluster(name=A_CLUSTER)
    assert err.value.response.json()["error"]["status"] == "UNAUTHENTICATED"
    with pytest.raises(gexc.Unauthorized):
        compute_client(sim, credentials=forged).get(
            project="proj-sim-a", zone="us-east5-b", reservation="res-sim-a", retry=None
        )
    req = urllib.request.Request(f"{sim.endpoints['gke']}/v1/{A_CLUSTER}")  # no Authorization header at all
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(req, timeout=5)
    assert http_err.value.code == 401
    core = k8s.CoreV1Api(kube_api_client(sim, "sim-k", token="ya29.not-issued-by-the-sim"))
    with pytest.raises(k8s.ApiException) as err:
        core.list_node()
    assert err.value.status == 401
    status = json.loads(err.value.body)
    assert status["kind"] == "Status" and status["reason"] == "Unauthorized" and status["code"] == 401


def test_expired_tokens_are_refused_and_google_auth_refreshes(virtual_sim):
    sim = virtual_sim  # token lifetimes on the fleet's clock, moved by the test
    sim.set_auth(token_ttl=1)
    credentials = google_credentials()
    request = google.auth.transport.requests.Request()
    credentials.refresh(request)
    first = credentials.token
    core = k8s.CoreV1Api(kube_api_client(sim, "sim-k", token=first))
    core.list_node()
    # google-auth treats a token this short-lived as stale at once (it refreshes ahead of expiry)
    assert not credentials.valid

    def refused():
        try:
            core.list_node()
        except k8s.ApiException as e:
            return e.status == 401
        return False

    sim.advance(0.9)
    assert not refused()  # still good just before its second is up
    sim.advance(0.1)
    assert refused()  # and refused at it
    credentials.refresh(request)
    assert credentials.token != first
    k8s.CoreV1Api(kube_api_client(sim, "sim-k", token=credentials.token)).list_node()


def test_cluster_token_ttl_fault_refuses_tokens_google_auth_still_trusts(virtual_sim):
    sim = virtual_sim  # token ages on the fleet's clock, moved by the test
    credentials = google_credentials()
    credentials.refresh(google.auth.transport.requests.Request())
    first = credentials.token
    gke = gke_client(sim, credentials=credentials)
    core_k = k8s.CoreV1Api(kube_api_client(sim, "sim-k", token=first))
    sim.set_faults("sim-k", token_ttl=0.5)
    sim.advance(0.4)
    core_k.list_node()  # younger than the cluster's limit: accepted
    sim.advance(0.1)
    assert credentials.valid  # a 3600 s token, as far as google-auth knows
    with pytest.raises(k8s.ApiException) as err:
        core_k.list_node()
    assert err.value.status == 401
    assert gke.get_cluster(name=A_CLUSTER).name == "sim-a"  # other clusters still accept it
    assert credentials.token == first
    # google-auth's session refreshes once on a 401 and retries: the GKE call recovers by itself
    assert gke.get_cluster(name=K_CLUSTER).name == "sim-k"
    assert credentials.token != first


def test_auth_can_be_switched_off_for_anonymous_clients(sim):
    sim.set_auth(required=False)
    assert gke_client(sim, credentials=AnonymousCredentials()).get_cluster(name=A_CLUSTER).name == "sim-a"
    from kubernetes import client

    cfg = client.Configuration(host=sim.endpoints["clusters"]["sim-k"]["kubernetes"])
    assert client.CoreV1Api(client.ApiClient(cfg)).list_node() is not None


def test_public_kubernetes_paths_need_no_token(sim):
    base = sim.endpoints["clusters"]["sim-k"]["kubernetes"]
    with urllib.request.urlopen(base + "/version", timeout=5) as resp:
        assert json.loads(resp.read())["major"] == "1"
    with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:
        assert resp.read() == b"ok"
