/* The WordPiece tokenizer's C interface: BERT pairs and their longest_first truncation (as transformers'
 * truncate_sequences), padding, types and mask, the vocabulary lookups, and refusals. The token rules
 * themselves are checked against a reference on real text by tests/parity/test_tokenizer.py. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "test_files.h"
#include "text/wordpiece.h"

/* ids: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, a..h 4..11, "##s" 12 */
static const char *vocab_file(void) {
  const char *path = tmp_path("wp_vocab.txt");
  FILE *f = fopen(path, "w");
  if (!f) return NULL;
  fputs("[PAD]\n[UNK]\n[CLS]\n[SEP]\na\nb\nc\nd\ne\nf\ng\nh\n##s\n", f);
  fclose(f);
  return path;
}

static dt_wordpiece *load(void) {
  dt_wordpiece *t = NULL;
  const char *path = vocab_file();
  if (!path || dt_wordpiece_load(path, 1, &t) != DT_OK) return NULL;
  return t;
}

TEST(vocabulary_lookups) {
  dt_wordpiece *t = load();
  ASSERT(t);
  ASSERT_EQ(dt_wordpiece_vocab_size(t), 13);
  ASSERT_EQ(dt_wordpiece_token_id(t, "c"), 6);
  ASSERT_EQ(dt_wordpiece_token_id(t, "##s"), 12);
  ASSERT_EQ(dt_wordpiece_token_id(t, "zz"), -1);
  dt_wordpiece_special s = dt_wordpiece_specials(t);
  ASSERT(s.pad == 0 && s.unk == 1 && s.cls == 2 && s.sep == 3);
  int32_t ids[8];
  size_t n = 0;
  ASSERT_OK(dt_wordpiece_encode(t, "A bs Zed", 8, ids, 8, &n)); /* a, b ##s, [UNK] */
  ASSERT_EQ(n, 4);
  ASSERT(ids[0] == 4 && ids[1] == 5 && ids[2] == 12 && ids[3] == 1);
  ASSERT_OK(dt_wordpiece_encode(t, "a b c d e", 9, ids, 2, &n)); /* the count past cap */
  ASSERT_EQ(n, 5);
  /* special tokens are split off whole; one the vocabulary lacks ([MASK] here) is [UNK], as BertTokenizer's */
  ASSERT_OK(dt_wordpiece_encode(t, "a[SEP]b [MASK] [mask]", 21, ids, 8, &n));
  const int32_t sp[7] = {4, 3, 5, 1, 1, 1, 1}; /* a [SEP] b [UNK] then "[ mask ]": [UNK] [UNK] [UNK] */
  ASSERT_EQ(n, 7);
  for (int i = 0; i < 7; i++) ASSERT_EQ(ids[i], sp[i]);
  dt_wordpiece_free(t);
}

/* "a b c d e" (5) and "f g" (2) in 8 positions: 5 + 2 + 3 = 10, two off the longer: a b c [SEP] f g. */
TEST(pairs_truncate_longest_first) {
  dt_wordpiece *t = load();
  ASSERT(t);
  int32_t ids[10], types[10], mask[10];
  int n = 0;
  ASSERT_OK(dt_wordpiece_encode_bert(t, "a b c d e", 9, "f g", 3, 8, ids, types, mask, &n));
  const int32_t want[8] = {2, 4, 5, 6, 3, 9, 10, 3}, want_types[8] = {0, 0, 0, 0, 0, 1, 1, 1};
  ASSERT_EQ(n, 8);
  for (int i = 0; i < 8; i++) ASSERT(ids[i] == want[i] && types[i] == want_types[i] && mask[i] == 1);
  /* equal lengths: the pair loses first, as transformers' (len(ids) > len(pair) is false) */
  ASSERT_OK(dt_wordpiece_encode_bert(t, "a b", 3, "c d", 3, 6, ids, types, mask, &n));
  const int32_t eq[6] = {2, 4, 5, 3, 6, 3};
  for (int i = 0; i < 6; i++) ASSERT_EQ(ids[i], eq[i]);
  /* room to spare: [PAD] with type 0 and mask 0 */
  ASSERT_OK(dt_wordpiece_encode_bert(t, "h", 1, NULL, 0, 6, ids, types, mask, &n));
  const int32_t pad[6] = {2, 11, 3, 0, 0, 0}, pmask[6] = {1, 1, 1, 0, 0, 0};
  ASSERT_EQ(n, 3);
  for (int i = 0; i < 6; i++) ASSERT(ids[i] == pad[i] && mask[i] == pmask[i] && types[i] == 0);
  dt_wordpiece_free(t);
}

TEST(refusals) {
  dt_wordpiece *t = load();
  ASSERT(t);
  int32_t ids[4], types[4], mask[4];
  int n;
  ASSERT_STATUS(dt_wordpiece_encode_bert(t, "a", 1, "b", 1, 3, ids, types, mask, &n), DT_INVALID_ARGUMENT);
  size_t m;
  ASSERT_STATUS(dt_wordpiece_encode(t, "a\xff", 2, ids, 4, &m), DT_CORRUPT);
  ASSERT(strstr(dt_last_error(), "byte 1"));
  dt_wordpiece_free(t);
  dt_wordpiece *u = NULL;
  ASSERT_STATUS(dt_wordpiece_load(tmp_path("no_such_vocab.txt"), 1, &u), DT_NOT_FOUND);
  ASSERT(strstr(dt_last_error(), "no_such_vocab.txt"));
}

TEST_MAIN(TEST_ENTRY(vocabulary_lookups), TEST_ENTRY(pairs_truncate_longest_first), TEST_ENTRY(refusals))
