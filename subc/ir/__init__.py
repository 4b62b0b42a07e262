"""The middle end: the rules' BDD, its slicing into one stage per field (Algorithm 1 of Jepsen et al.,
HotNets 2018), the frozen IR with decisions and aggregates, incremental slicing for live
subscriptions, and the one lowering of a state to entries.
"""
