"""deepspeed.runtime.fp16.loss_scaler: the classes DeepSpeed pickles into its optimizer files, so that a
DeepSpeed checkpoint loads here (ZeroShard's loss scaling runs inside the library)."""


class LossScalerBase:
    def __init__(self, cur_scale=1.0):
        self.cur_scale = cur_scale
        self.dynamic = False

    @property
    def loss_scale(self):
        return self.cur_scale


class LossScaler(LossScalerBase):
    def __init__(self, scale=1.0):
        super().__init__(scale)


class DynamicLossScaler(LossScalerBase):
    def __init__(self, init_scale=2 ** 32, scale_factor=2.0, scale_window=1000, min_scale=1, delayed_shift=1,
                 consecutive_hysteresis=False, raise_error_at_min_scale=True, dtype=None):
        super().__init__(init_scale)
        self.dynamic = True
        self.scale_factor, self.scale_window, self.min_scale = scale_factor, scale_window, min_scale
        self.delayed_shift = self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.dtype = dtype
        self.cur_iter = 0
        self.last_overflow_iter = -1
