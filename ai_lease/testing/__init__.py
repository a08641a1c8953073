"""Test helpers that ship with ai_lease: the store contract suite and process helpers.

Third-party stores test themselves by subclassing :class:`LeaseStoreContract`
(see ``ai_lease.testing.contract``).
"""
