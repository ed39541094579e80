"""Start a deployment's three services on a Ray instance (a new local one, or a cluster) and stop them."""

from __future__ import annotations

import os

import ray
from ray import serve
from ray.serve.handle import DeploymentHandle

from speclm.deploy.config import APP_NAME, DeployConfig
from speclm.deploy.services import Coordinator, DraftService, TargetService

LOCAL_OBJECT_STORE_BYTES = 256 * 2**20  # a new local instance's object store: calls carry token ids, not tensors
WORKER_NICENESS_ENV = "RAY_worker_niceness"
DRAFT_MAX_ONGOING_CALLS = 64  # one per speculating sequence of every target replica, with room to spare


def actor_options(node_resource: str | None) -> dict:
    """Replicas reserve no CPU from Ray (torch sizes its own threads); a node resource pins them to the
    machines started with it (`ray start --resources '{"NAME": 1}'`)."""
    options: dict = {"num_cpus": 0}
    if node_resource:
        options["resources"] = {node_resource: 0.001}
    return options


def build_application(config: DeployConfig):
    """The Ray Serve application: coordinator (ingress) -> target service -> draft service (when there is a draft)."""
    draft = None
    if config.draft is not None:
        draft = DraftService.options(
            num_replicas=config.draft_replicas,
            max_ongoing_requests=DRAFT_MAX_ONGOING_CALLS,
            ray_actor_options=actor_options(config.draft_endpoint),
        ).bind(config)
    target = TargetService.options(
        num_replicas=config.target_replicas,
        max_ongoing_requests=config.cache.max_num_seqs,  # more wait in Serve's queue, as the engine's would
        ray_actor_options=actor_options(config.target_endpoint),
    ).bind(config, draft)
    return Coordinator.options(max_ongoing_requests=config.server.max_concurrent_requests).bind(config, target)


def init_local_ray(num_cpus: int | None = None, log_to_driver: bool = True) -> None:
    """A new Ray instance on this machine, on loopback, whose workers import this process's speclm and run
    at normal priority (Ray starts workers at niceness 15, and a model service must not lose the CPU to
    every other process on the machine)."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    ray.init(
        address="local",
        num_cpus=num_cpus,
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        include_dashboard=False,
        log_to_driver=log_to_driver,
        runtime_env={"env_vars": {"PYTHONPATH": path, WORKER_NICENESS_ENV: "0"}},
        _node_ip_address="127.0.0.1",
    )


def start(
    config: DeployConfig, host: str = "127.0.0.1", port: int = 8000, ray_address: str | None = None
) -> DeploymentHandle:
    """Connect to Ray (`ray_address`, or RAY_ADDRESS, else a new local instance), start the HTTP proxy on
    host:port and deploy the services; returns when every replica is up."""
    if not ray.is_initialized():
        if ray_address is None and not os.environ.get("RAY_ADDRESS"):
            init_local_ray()
        else:
            ray.init(address=ray_address, runtime_env={"env_vars": {WORKER_NICENESS_ENV: "0"}})
    serve.start(http_options={"host": host, "port": port})
    return serve.run(build_application(config), name=APP_NAME, route_prefix="/")


def target_handle() -> DeploymentHandle:
    """The running deployment's target service (its call_stats, for benchmarks and tests)."""
    return serve.get_deployment_handle(TargetService.name, app_name=APP_NAME)


def stop() -> None:
    """Remove the services and disconnect (a local instance this process started shuts down)."""
    serve.shutdown()
    ray.shutdown()
