"""Trainer seams: thin adapters from this recipe's rollouts and samples to each trainer's API.

One module per trainer; each imports its trainer lazily (inside the functions that need it),
so ``orchard.recipes.swe`` itself depends on no trainer. The shared part,
:mod:`.common`, turns a recorded proxy sample into prompt / response token lists.
"""
