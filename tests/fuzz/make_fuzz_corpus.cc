// Writes the seed corpus of the fuzz targets: small valid inputs made with the project's own
// writers (TensorToProto, LayerSpecToProto, WriteSafetensors, WriteNpy, LayerSpecToJson), so that
// libFuzzer starts from messages and files the parsers accept and mutates from there.
//
//   make_fuzz_corpus OUT_DIR    writes OUT_DIR/<target>/<seed name>
//
// The output is committed as tests/fuzz/corpus/; run this again when the wire format or a file
// format changes (see tests/fuzz/README.md).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "attnserve/v1/attention_service.pb.h"
#include "client/attnctl/npy.h"
#include "kernels/model/checkpoint_loader.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/spec/layer_spec_json.h"
#include "kernels/model/layer_weights.h"
#include "kernels/model/safetensors.h"
#include "kernels/core/tensor.h"
#include "proto/codec/spec_codec.h"
#include "proto/codec/tensor_codec.h"
#include "tests/fuzz/fuzz_specs.h"

namespace attnserve {
namespace {

namespace fs = std::filesystem;

// Deterministic small values (no randomness: the committed corpus must be reproducible).
Tensor Ramp(DType dtype, std::vector<int64_t> shape) {
  Tensor f32(DType::kF32, shape);
  float* values = reinterpret_cast<float*>(f32.data());
  for (int64_t i = 0; i < f32.num_elements(); ++i)
    values[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  return f32.CastTo(dtype);
}

void WriteBytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

void WriteMessage(const fs::path& path, const google::protobuf::Message& message) {
  WriteBytes(path, message.SerializeAsString());
}

fs::path Dir(const fs::path& out, const std::string& target) {
  fs::path dir = out / target;
  fs::create_directories(dir);
  return dir;
}

LayerSpec Mqa() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMQA;
  spec.d_model = 8;
  spec.num_heads = 4;
  spec.num_kv_heads = 1;
  spec.head_dim = 2;
  spec.causal = false;
  spec.softmax_scale = 0.5f;
  return spec;
}

// A layer's weights under their checkpoint names (model.layers.0.self_attn.*), in `dtype`.
std::map<std::string, Tensor> CheckpointTensors(const LayerSpec& spec, DType dtype) {
  std::map<std::string, Tensor> tensors;
  for (const WeightShape& shape : ExpectedWeightShapes(spec)) {
    tensors.emplace(HfAttentionPrefix(0) + shape.name, Ramp(dtype, shape.shape));
  }
  return tensors;
}

void TensorSeeds(const fs::path& dir) {
  const std::vector<std::pair<std::string, Tensor>> seeds = {
      {"f32_2x8", Ramp(DType::kF32, {2, 8})},
      {"bf16_16", Ramp(DType::kBF16, {16})},
      {"f16_1x4", Ramp(DType::kF16, {1, 4})},
      {"f32_2x2x2", Ramp(DType::kF32, {2, 2, 2})},
  };
  for (const auto& [name, tensor] : seeds) {
    v1::Tensor proto;
    TensorToProto(tensor, &proto);
    WriteMessage(dir / name, proto);
  }
  Tensor nan = Ramp(DType::kF32, {1, 4});
  reinterpret_cast<float*>(nan.data())[2] = std::numeric_limits<float>::quiet_NaN();
  v1::Tensor proto;
  TensorToProto(nan, &proto);
  WriteMessage(dir / "f32_nan", proto);
}

void SpecSeeds(const fs::path& dir, const std::vector<LayerSpec>& specs) {
  for (const LayerSpec& spec : specs) {
    WriteMessage(dir / std::string(VariantName(spec.variant)), LayerSpecToProto(spec));
  }
}

void StepSeeds(const fs::path& dir) {
  // Against the MHA spec (d_model 8): two requests, one with positions.
  v1::ForwardRequest forward;
  forward.set_session_id("0123456789abcdef0123456789abcdef");
  v1::ForwardItem* first = forward.add_items();
  first->set_request_id("req-a");
  TensorToProto(Ramp(DType::kF32, {3, 8}), first->mutable_hidden());
  for (int64_t p : {0, 1, 2}) first->add_positions(p);
  v1::ForwardItem* second = forward.add_items();
  second->set_request_id("req-b");
  TensorToProto(Ramp(DType::kBF16, {1, 8}), second->mutable_hidden());
  WriteMessage(dir / "forward_d8", forward);

  // Against the GQA and MLA specs (d_model 16).
  v1::ForwardRequest wide;
  wide.set_session_id("s");
  v1::ForwardItem* item = wide.add_items();
  item->set_request_id("r");
  TensorToProto(Ramp(DType::kF16, {2, 16}), item->mutable_hidden());
  WriteMessage(dir / "forward_d16", wide);

  v1::DecodeRequest decode;
  decode.set_session_id("s");
  v1::DecodeItem* row = decode.add_items();
  row->set_request_id("req-a");
  TensorToProto(Ramp(DType::kF32, {1, 8}), row->mutable_hidden());
  row->set_position(3);
  v1::DecodeItem* flat = decode.add_items();
  flat->set_request_id("req-b");
  TensorToProto(Ramp(DType::kBF16, {8}), flat->mutable_hidden());
  WriteMessage(dir / "decode_d8", decode);

  v1::DecodeRequest decode16;
  v1::DecodeItem* one = decode16.add_items();
  one->set_request_id("x");
  TensorToProto(Ramp(DType::kF32, {16}), one->mutable_hidden());
  WriteMessage(dir / "decode_d16", decode16);
}

void ConfigureSeeds(const fs::path& dir, const std::vector<LayerSpec>& specs) {
  for (const LayerSpec& spec : specs) {
    v1::ConfigureRequest seeded;
    *seeded.mutable_spec() = LayerSpecToProto(spec);
    seeded.mutable_weights()->set_seed(7);
    seeded.set_kv_cache_dtype(v1::DTYPE_BF16);
    seeded.set_label("fuzz seed");
    WriteMessage(dir / (std::string(VariantName(spec.variant)) + "_seed"), seeded);

    v1::ConfigureRequest inlined;
    *inlined.mutable_spec() = LayerSpecToProto(spec);
    inlined.set_page_size(4);
    for (const WeightShape& shape : ExpectedWeightShapes(spec)) {
      v1::NamedTensor* named = inlined.mutable_weights()->mutable_inline_weights()->add_tensors();
      named->set_name(shape.name);
      TensorToProto(Ramp(DType::kBF16, shape.shape), named->mutable_tensor());
    }
    WriteMessage(dir / (std::string(VariantName(spec.variant)) + "_inline"), inlined);
  }
  v1::ConfigureRequest checkpoint;
  *checkpoint.mutable_spec() = LayerSpecToProto(specs.front());
  checkpoint.mutable_weights()->mutable_checkpoint()->set_path("/nonexistent/model.safetensors");
  checkpoint.mutable_weights()->mutable_checkpoint()->set_layer_index(3);
  WriteMessage(dir / "checkpoint", checkpoint);
}

void SafetensorsSeeds(const fs::path& dir, const std::vector<LayerSpec>& specs) {
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  for (size_t i = 0; i < specs.size(); ++i) {
    const fs::path path =
        dir / (std::string(VariantName(specs[i].variant)) + "_layer0.safetensors");
    absl::Status written =
        WriteSafetensors(path, CheckpointTensors(specs[i], dtypes[i % 3]), {{"format", "pt"}});
    if (!written.ok()) {
      std::fprintf(stderr, "%s\n", written.ToString().c_str());
      std::exit(1);
    }
  }
}

void NpySeeds(const fs::path& dir) {
  const std::vector<std::pair<std::string, Tensor>> seeds = {
      {"f32_2x8.npy", Ramp(DType::kF32, {2, 8})},
      {"f16_16.npy", Ramp(DType::kF16, {16})},
  };
  for (const auto& [name, tensor] : seeds) {
    absl::Status written = WriteNpy(dir / name, tensor);
    if (!written.ok()) {
      std::fprintf(stderr, "%s\n", written.ToString().c_str());
      std::exit(1);
    }
  }
}

void JsonSeeds(const fs::path& dir, const std::vector<LayerSpec>& specs) {
  for (const LayerSpec& spec : specs) {
    WriteBytes(dir / (std::string(VariantName(spec.variant)) + ".json"), LayerSpecToJson(spec));
  }
  // The minimal form of layer_spec_json.h: defaults left out.
  WriteBytes(dir / "minimal.json",
             R"({"variant": "gqa", "d_model": 64, "num_heads": 8, "num_kv_heads": 2, )"
             R"("head_dim": 8})");
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  using namespace attnserve;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  std::vector<LayerSpec> specs = fuzz::FuzzSpecs();
  specs.push_back(Mqa());
  TensorSeeds(Dir(out, "tensor_codec_fuzzer"));
  SpecSeeds(Dir(out, "spec_codec_fuzzer"), specs);
  StepSeeds(Dir(out, "step_codec_fuzzer"));
  ConfigureSeeds(Dir(out, "configure_request_fuzzer"), specs);
  SafetensorsSeeds(Dir(out, "safetensors_fuzzer"), fuzz::FuzzSpecs());
  NpySeeds(Dir(out, "npy_fuzzer"));
  JsonSeeds(Dir(out, "layer_spec_json_fuzzer"), specs);
  return 0;
}
