"""What WebRL learns and how: the models and their trainers.

    models          the actor (embedded or Hugging Face), tokenizers, prompt fitting, generation, log-probs
    webrl_trainer   the actor's KL-constrained update (paper Eq. 6): its config, loss, Trainer and ``train_actor``
    critic_trainer  the critic's Trainer and ``train_critic``
    sft_trainer     the bootstrap SFT (``sft_train``); the TRL SFT trainer with logits only where the loss needs them
    trainer_utils   what the trainers share: arguments, progress, data-parallel precompute and saving
    training        the trainers' public names re-exported (the launcher's ``tr``)
    critic          the value model V(s): the SFT backbone with two heads
    advantage       the actor loss's advantages and adaptive KL coefficient (paper Eq. 6 and 9)
    orm             the outcome reward model: P(YES) >= 0.5 is success
    replay          perplexity-filtered replay of earlier phases' successful steps
    transitions     step-level training samples from stored episodes
    sft_data        (prompt, action) demonstrations for the phase-0 SFT
    entity_swap     entity-swap augmentation of the demonstrations
    list_shuffle    list-order shuffle of the demonstrations (the clicked id follows its text)
    sft_augment     the bootstrap SFT's augmented passes (entity swap, list shuffle)
    curriculum      in-breadth task generation from failures and the critic filter (paper Sec. 3.1)
"""
