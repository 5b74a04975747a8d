"""fw_accelerate.py MODE DIR - checks what fw_accelerate.sh's runs left in DIR (RESULT files NAME.json); exits 1
on a mismatch. `fw_accelerate.py gather-run --result FILE` is one of those runs.

  parity      accelerate.json (plain Accelerate) against stage1.json and stage3.json (its DeepSpeed path on
              ZeroShard): losses within LOSS_TOL, accuracy above the majority class; clipping at 1.0 bites
  clip        auto.json ("gradient_clipping": "auto", from --deepspeed_config_file) trains as clip1.json (1.0)
              bit for bit, and not as clip0.json (no clipping)
  gather      plain.json and ds.json: gather_for_metrics over a drop_last loader counts the same samples
  resume      resumed.json (load_state after step 8) ends on full.json's losses and params-hash bit for bit
  cuda        cuda3.json (stage 3, zeroshard.device "cuda" over the CUDA emulator's library) has cpu3.json's
              losses and params-hash bit for bit
  gather-run  (2 ranks) 37 samples in batches of 5 with drop_last, gathered; writes the count
"""
import json
import os
import sys

from fw_checks import Checks

# the largest loss difference measured between Accelerate (DDP over gloo) and ZeroShard on these 20 steps: 1.8e-7
LOSS_TOL = 1e-5
C = Checks("fw_accelerate")


def mode_parity(d):
    C.parity(d, "accelerate", "Accelerate", LOSS_TOL, steps=20)


def mode_clip(d):
    auto, clip1, clip0 = C.load(d, "auto"), C.load(d, "clip1"), C.load(d, "clip0")
    C.clipping_bites(clip1, clip0)
    if auto["params_hash"] != clip1["params_hash"] or auto["losses"] != clip1["losses"]:
        C.fail(f'"gradient_clipping": "auto": params {auto["params_hash"]}, not clipping at 1.0\'s '
               f'{clip1["params_hash"]} (unclipped: {clip0["params_hash"]})')
    else:
        print(f'fw_accelerate clip: "gradient_clipping": "auto" clips at 1.0 (params {auto["params_hash"]}; '
              f'unclipped {clip0["params_hash"]})')


def mode_gather(d):
    plain, ds = C.load(d, "plain"), C.load(d, "ds")
    if (plain["samples"], plain["sum"]) != (ds["samples"], ds["sum"]):
        C.fail(f"gather_for_metrics over a drop_last loader: plain Accelerate {plain}, its DeepSpeed path {ds}")
    else:
        print(f"fw_accelerate gather: drop_last loader, both count {ds['samples']} samples ({ds['distributed_type']} "
              f"against {plain['distributed_type']})")


def mode_cuda(d):
    C.identical(d, "cpu3", "cuda3", "zeroshard.device \"cuda\" (the emulated GPU)", "zeroshard.device \"cpu\"")


def mode_resume(d):
    C.resumed(d, "load_state after step 8 (stage 3), steps 9-12")


def gather_run(out):
    """A plain Accelerate script: Accelerator() takes DeepSpeed from the environment when launched so."""
    import torch
    from accelerate import Accelerator
    if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
        acc = Accelerator()
    else:   # under mpirun: torch.distributed's variables from Open MPI's, as the examples do
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "pytorch"))
        import fortunes
        fortunes.mpi_to_torch_env()
        acc = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    data = torch.utils.data.TensorDataset(torch.arange(37.0).repeat_interleave(3).view(37, 3))
    loader = torch.utils.data.DataLoader(data, batch_size=5, drop_last=True)
    model, opt, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    seen = torch.cat([acc.gather_for_metrics(x[:, 0]) for (x,) in loader])
    if acc.is_main_process:
        with open(out, "w") as f:
            json.dump({"samples": len(seen), "sum": float(seen.sum()), "distributed_type": str(acc.distributed_type)}, f)
    if os.environ.get("ACCELERATE_USE_DEEPSPEED") != "true":
        # the plain run's gloo group ends here, as Accelerate's examples end theirs: left to interpreter exit,
        # gloo's threads can be torn down mid-use and abort the process ("terminate called ...")
        acc.wait_for_everyone()
        acc.end_training()


if __name__ == "__main__":
    if sys.argv[1] == "gather-run":
        if sys.argv[2] != "--result":
            sys.exit("fw_accelerate.py gather-run --result FILE")
        gather_run(sys.argv[3])
        sys.exit(0)
    C.run({"parity": mode_parity, "clip": mode_clip, "gather": mode_gather, "resume": mode_resume, "cuda": mode_cuda})
