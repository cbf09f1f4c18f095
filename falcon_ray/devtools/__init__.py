"""The development tools: production never imports this package.

It holds what runs the controller on one machine for people and tests rather than on a
fleet: the local demo (``demo``), the chaos soak (``chaos``), the benchmark (``bench``) and
the virtual-time simulator. The production image is built without it (deploy/Dockerfile),
and the import contracts in pyproject.toml keep every product module from importing it.
The simulated fleet the tools run against is ``falcon_ray.sim``.
"""
