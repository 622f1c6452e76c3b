//! The flags of `reshard inspect`.

use std::path::PathBuf;

use reshard::plan::order::Order;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A .safetensors/.bin file, a model folder, or a Hugging Face cache
    /// folder (models--ORG--NAME or one of its snapshots).
    pub path: PathBuf,
    /// List every tensor, one line each, in layer order.
    #[arg(long)]
    pub tensors: bool,
    #[command(flatten)]
    pub print: crate::cli::printer::OutputArgs,
    /// Exit 1 when there are findings.
    #[arg(long)]
    pub strict: bool,
    /// Print only the findings, one `PATH: finding` line each (nothing
    /// when there are none), and errors.
    #[arg(short, long, conflicts_with = "tensors")]
    pub quiet: bool,
    /// Order of the tensor list.
    #[arg(long, value_enum, default_value = "forward")]
    pub order: OrderArg,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum OrderArg {
    /// Embeddings, numbered blocks in order, final norm, head.
    Forward,
    /// transformers v5's dot-natural key.
    Natural,
    /// As the files list them.
    Source,
}

impl From<OrderArg> for Order {
    fn from(o: OrderArg) -> Order {
        match o {
            OrderArg::Forward => Order::Forward,
            OrderArg::Natural => Order::Natural,
            OrderArg::Source => Order::Source,
        }
    }
}
