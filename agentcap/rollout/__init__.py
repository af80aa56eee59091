"""How episodes are played: the driver (B items × G rollouts, one generate call per agent per turn),
the environments of each split and stage, and the Instruct harvest that is replayed."""
