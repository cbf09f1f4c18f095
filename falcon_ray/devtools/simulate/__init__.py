"""``falcon-ray simulate``: the controller in virtual time against a modelled fleet.

The product's poller, queues and cluster gateways (``actors.poller``, ``actors.queue``,
``actors.cluster``: the plain objects the Ray actors wrap, with the same decisions) run in
one process on a virtual clock against ``falcon_ray.sim``'s fleet model behind in-process
clients; time jumps from one thing that happens to the next, so a week of a fleet runs in
seconds to minutes and a run is replayable from its inputs and seed.

- ``schedule``: the virtual clock, the event queue, the loops on it;
- ``fleet``: the fleet model and its in-process GKE, Compute and Kubernetes clients;
- ``driver``: ``Simulation``, the objects wired together and the tasks played;
- ``report``: the figures of a run;
- ``generate``: realistic task files;
- ``cli``: the ``simulate`` command.

docs/simulate.md says how to run it and what the report means.
"""
