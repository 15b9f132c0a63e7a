"""fastdata.Mixture: weighted blends of datasets, exact, deterministic and resumable.

A mixture draws its batches from several sources (``fastdata.Dataset``s with the same
fields, or ``fastdata.TokenDataset``s with the same block length) in fixed proportions:
after every batch, each rank's count of every source, and all ranks' together, are
within one sample of the weight times the samples read (NOTE[blend-rule]). Each source
walks its own shuffled passes, every sample once per pass (NOTE[mixture-streams]); the
loader's ``state_dict()`` resumes the blend exactly, also under another world size, and
with other weights (a curriculum). docs/mixture.md has the rules.

The package, one job per module (each imports only those below it):

* ``_mixture``: :class:`Mixture`, its checks, plans, batches and prefetcher;
* ``_state``: the loader checkpoint of a mixture;
* ``_sources``: which datasets a mixture accepts (the checks and their messages);
* ``_fetch``: joining the sources' batches, and their counters as one runtime's;
* ``_plan``: :class:`MixturePlan`, the batches of a rank (pure, no torch);
* ``_blend``: the blend rule (pure integer arithmetic, no torch).
"""

from fastdata.mixture._blend import BlendWeights, blend_step
from fastdata.mixture._fetch import SOURCE_KEY
from fastdata.mixture._mixture import Mixture
from fastdata.mixture._plan import MixtureOrder, MixturePlan, Segment

__all__ = [
    "SOURCE_KEY",
    "BlendWeights",
    "Mixture",
    "MixtureOrder",
    "MixturePlan",
    "Segment",
    "blend_step",
]
