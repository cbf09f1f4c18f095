"""The rules of one edge cluster's node pools, as pure functions: what ``actors.cluster``'s
gateway observed goes in, what to do comes out.

- ``ledger``: the claims of Falcon's pools on the cluster's reservation, and whether a new
  claim is granted.
- ``orphans``: which pools of this installation nothing manages any more.
- ``operations``: what a failed node-pool operation does next (retry after a delay, or fail),
  and which errors mean the operation's goal already holds.

No module here reads the time, the database or an API: the caller passes ``now``.
"""
