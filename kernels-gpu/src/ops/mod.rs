//! The operation kernels (softmax and log-softmax forward with scale and masks, their backward
//! passes, per-row log-sum-exp and partial statistics), for f32, bf16 and f16 input: one PTX
//! module per input type (`ops-<type>`).

mod op_templates;
mod row_kernel;
