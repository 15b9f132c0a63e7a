"""The store contract: shipped as ``fastdata.testing.store_contract`` (so a third-party
store or server can prove itself), imported from there for fastdata's own tests."""

from fastdata.testing.store_contract import MakeStore, StoreContract, StoreFaultContract

__all__ = ["MakeStore", "StoreContract", "StoreFaultContract"]
