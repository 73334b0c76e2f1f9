"""sharpscale's optimisation methods (SAM and its GCSAM knob, ASAM, GSAM, LookSAM, SAF, MESA, ESAM, F-SAM, MSAM, WSAM, SAMPa, VaSSO, bSAM), their scope and schedule, behind one step interface; pure PyTorch."""

from __future__ import annotations

from optim.lazy import exports

# Each public name once, with its home. The registry (names, knobs and their rules) imports no torch, so a study
# file validates without it; the classes load torch when first named. Type checkers read __init__.pyi, generated
# from this by optim.lazy.write_stubs().
__all__, __getattr__, __dir__ = exports(
    __name__,
    {
        "_registry": (
            "METHODS",
            "MethodSpec",
            "check_base",
            "check_hparams",
            "check_step_kinds",
            "create",
            "method_names",
        ),
        "_schedule": ("Schedule", "check_schedule"),
        "_scope": ("check_scope",),
        "_scheduled": ("Scheduled",),
        "_method": ("Method", "StepKeywords", "StepOutput"),
        "_sam": ("SAM",),
        "_gsam": ("GSAM",),
        "_looksam": ("LookSAM",),
        "_trajectory": ("MESA", "SAF", "trajectory_kl"),
        "_esam": ("ESAM",),
        "_fsam": ("FriendlySAM",),
        "_msam": ("MSAM",),
        "_wsam": ("WSAM",),
        "_sampa": ("SAMPa",),
        "_vasso": ("VaSSO",),
        "_bsam": ("BSAM",),
    },
)
