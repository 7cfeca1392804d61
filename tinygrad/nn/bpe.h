// GPT-2's byte-level BPE tokenizer (what `tg tokenize --bpe=DIR` writes shards with): the
// vocabulary and merges files as GPT-2 ships them (encoder.json and vocab.bpe) or as Hugging
// Face's tokenizers write them (vocab.json and merges.txt), the same regular-expression split of
// the text into pieces, and the merges applied to each piece's bytes by rank. Encoding needs PCRE2
// for the split (its Unicode letter and number classes); a build without it refuses with a clear
// error. See Note [byte-level BPE] in bpe.cpp.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace tg::nn {

class Gpt2Bpe {
 public:
  // Reads DIR/vocab.json and DIR/merges.txt, or DIR/encoder.json and DIR/vocab.bpe. Errors name
  // the file and what is wrong with it.
  static Gpt2Bpe load(const std::string& dir);
  Gpt2Bpe(std::map<std::string, int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
          const std::string& source = "the vocabulary");

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  size_t vocab_size() const { return token_of_.size(); }
  // The id of "<|endoftext|>" (GPT-2: 50256), which separates documents; -1 when the vocabulary has none.
  int32_t end_of_text() const { return end_of_text_; }

  static bool available();  // whether this build can split text (PCRE2)

 private:
  std::unordered_map<std::string, int32_t> id_of_;  // a token's characters (bytes as GPT-2's unicode) -> id
  std::vector<std::string> token_of_;                // id -> its characters
  std::unordered_map<std::string, int> rank_;        // "left right" -> merge rank
  int32_t end_of_text_ = -1;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;  // piece -> ids

  std::vector<int32_t> encode_piece(const std::string& piece) const;
};

// A document's tokens for llm.c shards: <|endoftext|> first (as llm.c's data scripts write each
// document), then the text's. Refuses vocabularies whose ids do not fit the shards' uint16.
std::vector<uint16_t> gpt2_document_tokens(const Gpt2Bpe& bpe, const std::string& text);

}  // namespace tg::nn
