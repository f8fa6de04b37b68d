//! `fornax info`: the model, the backend and the adapter.

use anyhow::Result;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::model::LlamaConfig;

use super::{parse, ModelArgs};

struct Report;

impl BackendTask for Report {
    type Output = DeviceInfo;
    fn run<B: fornax_engine::EngineBackend>(
        self,
        _device: B::Device,
        info: DeviceInfo,
    ) -> DeviceInfo {
        info
    }
}

pub fn run(args: ModelArgs) -> Result<()> {
    let path = args.path()?;
    let file = fornax::model_file::ModelFile::open(&path)?;
    let gguf = parse(&file)?;
    let config = LlamaConfig::from_gguf(&gguf)?;
    let name = gguf
        .get("general.name")
        .and_then(|v| v.as_str())
        .unwrap_or("unnamed");
    let mut types: Vec<String> = Vec::new();
    for t in &gguf.tensors {
        let ty = format!("{:?}", t.ggml_type);
        if !types.contains(&ty) {
            types.push(ty);
        }
    }
    let params: u64 = gguf.tensors.iter().map(|t| t.elements()).sum();
    println!("model:    {name} ({})", path.display());
    println!(
        "format:   GGUF v{}, {} tensors ({}), {:.1}M parameters",
        gguf.version,
        gguf.tensors.len(),
        types.join(", "),
        params as f64 / 1e6
    );
    println!(
        "config:   {} layers, d_model {}, {} heads / {} kv heads, d_ff {}, vocab {}, context {}, rope base {}",
        config.n_layers, config.d_model, config.n_heads, config.n_kv_heads, config.d_ff, config.vocab_size, config.max_seq_len, config.rope_theta
    );
    let info = args.run_on(Report)?;
    println!("backend:  {}", info.kind);
    println!("adapter:  {}", info.adapter);
    Ok(())
}
