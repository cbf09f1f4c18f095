"""The rules of one edge cluster's gateway, as pure functions: what ``actors.cluster``'s
gateway observed goes in, what to do comes out.

- ``ledger``: the claims of Falcon's pools on the cluster's reservation, and whether a new
  claim is granted.
- ``orphans``: which pools of this installation nothing manages any more.
- ``operations``: whether a create or delete asked for is queued, which queued operation
  runs next, what a failed one does next (retry after a delay, or fail), and which errors
  mean the operation's goal already holds.
- ``connection``: the delay before the next connect attempt after failed ones.
- ``jobs``: which view of a task's Job the Job cache keeps.

The readiness of a run between its Job's events (whether it falters, and since when) is
``falcon_ray.faults.track_run``.

No module here reads the time, the database or an API, or draws a random number: the
caller passes ``now`` and any jitter.
"""
