//! `fornax info`: the model, the backend and the adapter.

use anyhow::Result;
use fornax_backends::{BackendTask, DeviceInfo};
use fornax_engine::model::config_from_gguf;

use fornax_options::{parse, ModelArgs};

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
    let file = fornax_engine::store::ModelFile::open(&path)?;
    let gguf = parse(&file)?;
    let config = config_from_gguf(&gguf)?;
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
    let c = &config;
    println!(
        "config:   {} ({}), {} layers, d_model {}, {} heads / {} kv heads of {}, d_ff {}, vocab {}, context {}",
        c.architecture, name, c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff, c.vocab_size, c.max_seq_len
    );
    let windowed = c.layers.iter().filter(|l| l.window.is_some()).count();
    let window = c.layers.iter().find_map(|l| l.window);
    let thetas: Vec<String> = c.rope_thetas().iter().map(|t| t.to_string()).collect();
    println!(
        "layers:   rope base {}, {:?} rope, {:?} gate, {}",
        thetas.join(" / "),
        c.rope_style,
        c.activation,
        match window {
            Some(w) => format!("{windowed} of {} layers windowed to {w} keys", c.n_layers),
            None => "full attention".into(),
        }
    );
    let info = args.run_on(Report)?;
    println!("backend:  {}", info.kind);
    println!("adapter:  {}", info.adapter);
    println!("dtype:    {}", info.dtype);
    Ok(())
}
