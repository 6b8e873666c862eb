// SentencePiece `tokenizer.model` behind the Tokenizer interface, through libsentencepiece
// (Debian's libsentencepiece-dev): the model's own normalizer and algorithm (unigram or BPE)
// run exactly as the library runs them, so the ids are the ones the model was trained on.
#include <sentencepiece_processor.h>

#include <fmt/format.h>

#include "text/tokenizer.h"

namespace strata::tokenizer {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string path, std::unique_ptr<sentencepiece::SentencePieceProcessor> processor)
      : path_(std::move(path)), processor_(std::move(processor)) {}

  Status encode_into(std::string_view text, std::vector<uint32_t>& ids, const ProgressFn& progress) const override {
    std::vector<int> encoded;
    sentencepiece::util::Status status = processor_->Encode({text.data(), text.size()}, &encoded);
    if (!status.ok())
      return make_error(ErrorKind::invalid_argument, fmt::format("{}: cannot encode the text: {}", path_, status.ToString()));
    ids.reserve(ids.size() + encoded.size());
    for (int id : encoded) ids.push_back(static_cast<uint32_t>(id));
    if (progress) progress(text.size());
    return Status();
  }

  Result<std::string> decode(std::span<const uint32_t> ids) const override {
    std::vector<int> as_int;
    as_int.reserve(ids.size());
    for (uint32_t id : ids) {
      if (id >= vocab_size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("token id {} is outside the vocabulary of {} ({})", id, vocab_size(), path_));
      as_int.push_back(static_cast<int>(id));
    }
    std::string text;
    sentencepiece::util::Status status = processor_->Decode(as_int, &text);
    if (!status.ok())
      return make_error(ErrorKind::invalid_argument, fmt::format("{}: cannot decode: {}", path_, status.ToString()));
    return text;
  }

  uint32_t vocab_size() const override { return static_cast<uint32_t>(processor_->GetPieceSize()); }
  std::optional<uint32_t> bos_id() const override { return optional_id(processor_->bos_id()); }
  std::optional<uint32_t> eos_id() const override { return optional_id(processor_->eos_id()); }
  const char* kind() const override { return "sentencepiece"; }
  std::optional<uint32_t> token_id(std::string_view token) const override {
    int id = processor_->PieceToId({token.data(), token.size()});  // the unknown piece's id when absent
    if (id < 0 || processor_->IdToPiece(id) != token) return std::nullopt;
    return static_cast<uint32_t>(id);
  }

 private:
  std::optional<uint32_t> optional_id(int id) const {  // the library says -1 for "none"
    if (id < 0 || static_cast<uint32_t>(id) >= vocab_size()) return std::nullopt;
    return static_cast<uint32_t>(id);
  }
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_sentencepiece(const std::string& path) {
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  sentencepiece::util::Status status = processor->Load(path);
  if (!status.ok())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: not a SentencePiece model: {}", path, status.ToString()));
  if (processor->GetPieceSize() <= 0)
    return make_error(ErrorKind::invalid_argument, fmt::format("{}: key 'pieces': the model has no pieces", path));
  return std::unique_ptr<Tokenizer>(std::make_unique<SentencePieceTokenizer>(path, std::move(processor)));
}

}  // namespace strata::tokenizer
