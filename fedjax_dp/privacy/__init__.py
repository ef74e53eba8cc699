"""Privacy: record selection, clipping, noise and the private gradient (one concept per module),
noise mechanisms, dp-accounting wrappers, the privacy ledger and noise calibration;
the shuffle-DP binomial vector sum (``shuffle``) and its exact PLD (``shuffle_accounting``); secure
aggregation in Z_{2^32} (:mod:`fedjax_dp.privacy.secagg`, ``secagg_shares``, ``secagg_masks``).

Builds on :mod:`fedjax_dp.core` only; it never trains and knows no algorithm."""
from fedjax_dp.privacy import (accounting, adaptive_clip, batch_selection, calibration, clipping,
                               correlated_noise, ledger,
                               mechanisms, noise, private_grad, shuffle, shuffle_accounting)
from fedjax_dp.privacy import secagg, secagg_masks, secagg_shares
from fedjax_dp.privacy.secagg import SecAggConfig
from fedjax_dp.privacy.accounting import (
    ACCOUNTANTS, DEFAULT_PLD_DISCRETIZATION, DEFAULT_RDP_ORDERS, composed_accountant,
    delta_for_epsilon, epsilon, epsilon_from_rdp, event_from_json, event_rdp, event_to_json,
    gaussian_event, laplace_event, make_accountant, sampled_gaussian_epsilon,
    sampled_gaussian_event)
from fedjax_dp.privacy.calibration import calibrate_noise_multiplier, calibrate_sampled_gaussian
from fedjax_dp.privacy.gnmax import gnmax_epsilon, gnmax_logq, gnmax_rdp, gnmax_total_rdp
from fedjax_dp.privacy.ledger import UNITS, LedgerEntry, PrivacyLedger
from fedjax_dp.privacy.lnmax import lnmax_log_moments, lnmax_q, moments_epsilon
from fedjax_dp.privacy.clipping import clip_by_global_norm
from fedjax_dp.privacy.mechanisms import (agent_vote_noise, gaussian_mechanism, laplace_mechanism,
                                          noisy_argmax_laplace, noisy_argmax_vote)
from fedjax_dp.privacy.noise import gaussian_noise, laplace_noise
from fedjax_dp.privacy.shuffle import ShuffleConfig, shuffle_vector_sum
from fedjax_dp.privacy.shuffle_accounting import BinomialSumEvent

__all__ = [
    "gnmax_epsilon", "gnmax_logq", "gnmax_rdp", "gnmax_total_rdp",
    "accounting", "adaptive_clip", "batch_selection", "calibration", "clipping", "ledger", "mechanisms", "noise",
    "private_grad", "shuffle", "shuffle_accounting",
    "secagg", "secagg_masks", "secagg_shares", "SecAggConfig",
    "BinomialSumEvent", "ShuffleConfig", "shuffle_vector_sum",
    "ACCOUNTANTS", "DEFAULT_PLD_DISCRETIZATION", "DEFAULT_RDP_ORDERS", "composed_accountant",
    "delta_for_epsilon", "epsilon", "epsilon_from_rdp", "event_from_json", "event_rdp",
    "event_to_json", "gaussian_event", "laplace_event", "make_accountant",
    "sampled_gaussian_epsilon", "sampled_gaussian_event",
    "calibrate_noise_multiplier", "calibrate_sampled_gaussian",
    "UNITS", "LedgerEntry", "PrivacyLedger",
    "lnmax_log_moments", "lnmax_q", "moments_epsilon",
    "agent_vote_noise", "clip_by_global_norm", "gaussian_mechanism", "gaussian_noise",
    "laplace_mechanism", "laplace_noise", "noisy_argmax_laplace", "noisy_argmax_vote",
]
