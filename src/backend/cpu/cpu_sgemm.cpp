// CPU backend: tandem's own f32 matrix product with fused epilogues (see cpu_sgemm.h for why).
//
// The loops are the usual ones of a packed product: B in blocks of kKc rows and kNc columns, packed into
// strips of 16 columns ([kc][16], one 16 KB strip stays in L1 while it is used); A in blocks of kMc rows
// packed into panels of 6 rows ([kc][6]); a 6 x 16 tile of C accumulated in twelve AVX registers. Each
// block of B is packed once and shared by the threads, which take (rows of A, group of strips) tasks.
#include "backend/cpu/cpu_sgemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "backend/cpu/cpu_parallel.h"
#include "backend/cpu/cpu_vec_math.h"
#include "backend/elementwise_functors.h"

#if defined(__AVX2__) && defined(__FMA__)
#define TANDEM_SGEMM_AVX2 1
#include <immintrin.h>
#else
#define TANDEM_SGEMM_AVX2 0
#endif

namespace tandem::backend::cpu {

bool sgemm_available() {
#if TANDEM_SGEMM_AVX2
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

bool sgemm_preferred(bool ta, int64_t m, int64_t n, int64_t k) {
  if (!sgemm_available()) return false;
  // bench/cpu_gemm_bench.cpp on the 2-core AMD EPYC machine (AVX2), thread CPU time, best of 31 rounds,
  // against OpenBLAS 0.3.21: at 512 and 2048 rows (a small GPT's products of width 128: 128 to 512 columns
  // and depths of 128 to 512) the own kernel took 0.87-1.05 of OpenBLAS's time untransposed (x W^T, g W)
  // and 1.02-1.12 with op(A) transposed (the weight gradients g^T x); at 1024 cubed it took 1.10-1.14.
  // So it takes untransposed products up to 2048 x 512 x 512 and leaves OpenBLAS the rest.
  return !ta && sgemm_fits(m, n) &&
         static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) <= 2048.0 * 512.0 * 512.0;
}

bool sgemm_fits(int64_t m, int64_t n) { return sgemm_available() && m >= 6 && n >= 16; }

#if TANDEM_SGEMM_AVX2

namespace {

constexpr int kMr = 6, kNr = 16;
constexpr int64_t kKc = 512;  // the most rows of a B strip (32 KB): in L1 while the panels of A pass over it
constexpr int64_t kMc = 48;   // rows of A per task (8 panels, 48 KB of packed A)
constexpr int64_t kNc = 256;  // columns of B per packed block (256 KB at kKc rows)
constexpr int64_t kStripsPerTask = 4;

// A growing, 64-byte aligned scratch buffer per thread.
struct Scratch {
  float* data = nullptr;
  int64_t size = 0;
  ~Scratch() { std::free(data); }
  float* get(int64_t n) {
    if (n > size) {
      std::free(data);
      const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
      data = static_cast<float*>(std::aligned_alloc(64, bytes));
      TANDEM_CHECK(data != nullptr, "sgemm: out of memory for a packing buffer of ", bytes, " bytes");
      size = n;
    }
    return data;
  }
};
thread_local Scratch t_pack_a, t_pack_b;

// op(A)[i0 .. i0+rows) x [p0 .. p0+kc) into panels of 6 rows, [kc][6] each, rows past `rows` zero.
void pack_a(bool ta, const float* a, int64_t lda, int64_t i0, int64_t rows, int64_t p0, int64_t kc, float* dst) {
  if (ta && rows % kMr == 0) {
    // Row by row of A (k): each row's 6 rows of op(A) per panel are adjacent, and a row of A is read once
    // for all the panels (panel by panel, the block's rows would come from L2 again for each). Eight lanes
    // are stored for six: the two extra ones are overwritten by the next k; the last k of a panel stores its
    // six alone (the next panel's first k is written already). The masked load reads nothing past the six.
    const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    const int64_t panels = rows / kMr;
    for (int64_t p = 0; p < kc; ++p) {
      const float* s = a + (p0 + p) * lda + i0;
      float* d = dst + p * kMr;
      if (p + 1 < kc) {
        for (int64_t q = 0; q < panels; ++q) _mm256_storeu_ps(d + q * kc * kMr, _mm256_maskload_ps(s + q * kMr, six));
      } else {
        for (int64_t q = 0; q < panels; ++q) _mm256_maskstore_ps(d + q * kc * kMr, six, _mm256_maskload_ps(s + q * kMr, six));
      }
    }
    return;
  }
  for (int64_t r = 0; r < rows; r += kMr) {
    const int mr = static_cast<int>(std::min<int64_t>(kMr, rows - r));
    float* d = dst + r * kc;
    if (ta) {  // op(A)(i, p) = a[p, i]: 6 consecutive floats of each row p
      const float* s = a + p0 * lda + i0 + r;
      if (mr == kMr) {
        // Eight lanes stored for six: the two extra ones are overwritten by the next k (the buffer has room
        // for them after the last); the masked load reads nothing past the six.
        const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
        for (int64_t p = 0; p < kc; ++p, s += lda, d += kMr) _mm256_storeu_ps(d, _mm256_maskload_ps(s, six));
      } else {
        for (int64_t p = 0; p < kc; ++p, s += lda, d += kMr)
          for (int i = 0; i < kMr; ++i) d[i] = i < mr ? s[i] : 0.0f;
      }
    } else {  // op(A)(i, p) = a[i, p]: six rows read side by side
      const float* s[kMr];
      for (int i = 0; i < kMr; ++i) s[i] = a + (i0 + r + std::min(i, mr - 1)) * lda + p0;
      if (mr == kMr) {
        for (int64_t p = 0; p < kc; ++p, d += kMr)
          for (int i = 0; i < kMr; ++i) d[i] = s[i][p];
      } else {
        for (int64_t p = 0; p < kc; ++p, d += kMr)
          for (int i = 0; i < kMr; ++i) d[i] = i < mr ? s[i][p] : 0.0f;
      }
    }
  }
}

// Strip `strip` (16 columns from j0 + 16 strip) of op(B)[p0 .. p0+kc) x [j0 .. j0+cols) into [kc][16],
// columns past `cols` zero.
void pack_b_strip(bool tb, const float* b, int64_t ldb, int64_t p0, int64_t kc, int64_t j0, int64_t cols,
                  int64_t strip, float* dst) {
  const int64_t jj = strip * kNr;
  const int nr = static_cast<int>(std::min<int64_t>(kNr, cols - jj));
  float* d = dst + strip * kc * kNr;
  if (!tb) {  // op(B)(p, j) = b[p, j]: 16 consecutive floats of each row p
    const float* s = b + p0 * ldb + j0 + jj;
    if (nr == kNr) {
      for (int64_t p = 0; p < kc; ++p, s += ldb, d += kNr) {
        _mm256_store_ps(d, _mm256_loadu_ps(s));
        _mm256_store_ps(d + 8, _mm256_loadu_ps(s + 8));
      }
    } else {
      for (int64_t p = 0; p < kc; ++p, s += ldb, d += kNr)
        for (int j = 0; j < kNr; ++j) d[j] = j < nr ? s[j] : 0.0f;
    }
    return;
  }
  // op(B)(p, j) = b[j, p]: rows of b become columns of the strip, 8 x 8 blocks transposed in registers.
  const float* s = b + (j0 + jj) * ldb + p0;
  int64_t p = 0;
  if (nr == kNr) {
    for (; p + 8 <= kc; p += 8) {
      for (int h = 0; h < 2; ++h) {
        __m256 r[8];
        for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(s + (h * 8 + j) * ldb + p);
        // The 8 x 8 transpose: unpack pairs, shuffle quads, swap 128-bit halves.
        const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
        const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
        const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
        const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
        const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
        const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        float* o = d + p * kNr + h * 8;
        _mm256_store_ps(o + 0 * kNr, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_store_ps(o + 1 * kNr, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_store_ps(o + 2 * kNr, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_store_ps(o + 3 * kNr, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_store_ps(o + 4 * kNr, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_store_ps(o + 5 * kNr, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_store_ps(o + 6 * kNr, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_store_ps(o + 7 * kNr, _mm256_permute2f128_ps(u3, u7, 0x31));
      }
    }
  }
  for (; p < kc; ++p)
    for (int j = 0; j < kNr; ++j) d[p * kNr + j] = j < nr ? s[j * ldb + p] : 0.0f;
}

// The 6 x 16 tile of rows of op(A) times the strip of B over kc, op(A)(i, p) at a[i rs + p cs] (read in place).
// kDirect: the tile is whole, the product's only block of k and has at most a bias to add: C = alpha acc + bias
// is stored from the registers (out: C's tile, rows ldo apart; bias null or the tile's 16). Otherwise acc is
// stored to out [6][16] for store_tile.
template <bool kDirect>
inline void kernel_6x16(int64_t kc, const float* __restrict a, int64_t rs, int64_t cs, const float* __restrict b,
                        float* __restrict out, int64_t ldo, float alpha, const float* __restrict bias) {
  __m256 c[kMr][2];
  for (int i = 0; i < kMr; ++i) c[i][0] = c[i][1] = _mm256_setzero_ps();
  const float* a0 = a;
  const float* a3 = a + 3 * rs;
  const int64_t rs2 = 2 * rs;
  for (int64_t p = 0; p < kc; ++p, a0 += cs, a3 += cs, b += kNr) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    __m256 av = _mm256_broadcast_ss(a0);
    c[0][0] = _mm256_fmadd_ps(av, b0, c[0][0]);
    c[0][1] = _mm256_fmadd_ps(av, b1, c[0][1]);
    av = _mm256_broadcast_ss(a0 + rs);
    c[1][0] = _mm256_fmadd_ps(av, b0, c[1][0]);
    c[1][1] = _mm256_fmadd_ps(av, b1, c[1][1]);
    av = _mm256_broadcast_ss(a0 + rs2);
    c[2][0] = _mm256_fmadd_ps(av, b0, c[2][0]);
    c[2][1] = _mm256_fmadd_ps(av, b1, c[2][1]);
    av = _mm256_broadcast_ss(a3);
    c[3][0] = _mm256_fmadd_ps(av, b0, c[3][0]);
    c[3][1] = _mm256_fmadd_ps(av, b1, c[3][1]);
    av = _mm256_broadcast_ss(a3 + rs);
    c[4][0] = _mm256_fmadd_ps(av, b0, c[4][0]);
    c[4][1] = _mm256_fmadd_ps(av, b1, c[4][1]);
    av = _mm256_broadcast_ss(a3 + rs2);
    c[5][0] = _mm256_fmadd_ps(av, b0, c[5][0]);
    c[5][1] = _mm256_fmadd_ps(av, b1, c[5][1]);
  }
  if constexpr (kDirect) {
    const __m256 al = _mm256_set1_ps(alpha);
    const __m256 bias0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    const __m256 bias1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
    for (int i = 0; i < kMr; ++i) {
      _mm256_storeu_ps(out + i * ldo, _mm256_fmadd_ps(al, c[i][0], bias0));
      _mm256_storeu_ps(out + i * ldo + 8, _mm256_fmadd_ps(al, c[i][1], bias1));
    }
  } else {
    for (int i = 0; i < kMr; ++i) {
      _mm256_store_ps(out + i * kNr, c[i][0]);
      _mm256_store_ps(out + i * kNr + 8, c[i][1]);
    }
  }
}

constexpr float kC0 = static_cast<float>(ewf::kSqrt2RsqrtPi), kC1 = static_cast<float>(ewf::kGeluKappa);

// s = (1 + tanh(u)) / 2 = 1 / (1 + e^(-2u)) for the GELU's u = sqrt(2 / pi) (x + 0.044715 x^3). The exponent
// is kept in [-87, 80], where e^ stays a normal float (a subnormal 1 / (1 + e) would be slow), and s is taken
// as 0 past 80 (x below about -9.6, where tanh(u) is -1 in float): the scalar formula's values there, -inf
// giving NaN as it does. NaN stays NaN.
inline __m256 gelu_sigmoid(__m256 x) {
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 u = _mm256_mul_ps(_mm256_set1_ps(kC0), _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(kC1), x2), x, x));
  const __m256 arg = _mm256_mul_ps(_mm256_set1_ps(-2.0f), u), top = _mm256_set1_ps(80.0f);
  const __m256 e = exp256<true>(_mm256_min_ps(top, _mm256_max_ps(_mm256_set1_ps(-87.0f), arg)));
  const __m256 s = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  return _mm256_andnot_ps(_mm256_cmp_ps(arg, top, _CMP_GT_OQ), s);
}

// gelu(x) = x s.
inline __m256 gelu256(__m256 x) { return _mm256_mul_ps(x, gelu_sigmoid(x)); }

// gelu'(x) = s + x (1 - t^2) u' / 2 = s + 2 x s (1 - s) sqrt(2 / pi) (1 + 3 0.044715 x^2).
inline __m256 gelu_grad256(__m256 x) {
  const __m256 s = gelu_sigmoid(x), one = _mm256_set1_ps(1.0f);
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 du = _mm256_mul_ps(_mm256_set1_ps(2.0f * kC0), _mm256_fmadd_ps(_mm256_set1_ps(3.0f * kC1), x2, one));
  return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(x, s), _mm256_sub_ps(one, s)), du, s);
}

// Lane masks for the first n (0..8) lanes.
inline __m256i lane_mask(int n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

struct Job {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  SgemmEpilogue e;
};

// Stores the 6 x 16 tile acc at (i0, j0) of C (mr x nr valid): first, the first block of k (C's old value
// taken as beta C, with the addend); last, the last one (the epilogue applied).
void store_tile(const Job& jb, const float* acc, int64_t i0, int64_t j0, int mr, int nr, bool first, bool last) {
  const __m256 alpha = _mm256_set1_ps(jb.alpha), beta = _mm256_set1_ps(jb.beta);
  const bool read_c = !first || jb.beta != 0.0f;
  const SgemmEpilogue& e = jb.e;
  const __m256i full = _mm256_set1_epi32(-1);
  const __m256i m0 = nr >= 8 ? full : lane_mask(nr), m1 = nr >= 16 ? full : lane_mask(std::max(0, nr - 8));
  const bool whole = nr == kNr;
  auto load = [&](const float* p, int h) {
    return whole ? _mm256_loadu_ps(p + 8 * h) : _mm256_maskload_ps(p + 8 * h, h ? m1 : m0);
  };
  auto store = [&](float* p, int h, __m256 v) {
    if (whole)
      _mm256_storeu_ps(p + 8 * h, v);
    else
      _mm256_maskstore_ps(p + 8 * h, h ? m1 : m0, v);
  };
  for (int r = 0; r < mr; ++r) {
    const int64_t i = i0 + r;
    float* crow = jb.c + i * jb.ldc + j0;
    for (int h = 0; h < 2; ++h) {
      if (8 * h >= nr) break;
      __m256 v = _mm256_mul_ps(alpha, _mm256_load_ps(acc + r * kNr + 8 * h));
      if (first) {
        if (jb.beta != 0.0f) v = _mm256_fmadd_ps(beta, load(crow, h), v);
        if (e.addend) v = _mm256_add_ps(v, load(e.addend + i * e.ld_addend + j0, h));
      } else if (read_c) {
        v = _mm256_add_ps(v, load(crow, h));
      }
      if (last) {
        switch (e.kind) {
          case SgemmEpilogue::Kind::None: break;
          case SgemmEpilogue::Kind::Bias: v = _mm256_add_ps(v, load(e.bias + j0, h)); break;
          case SgemmEpilogue::Kind::BiasGelu:
            v = _mm256_add_ps(v, load(e.bias + j0, h));
            store(e.aux + i * e.ld_aux + j0, h, v);
            v = gelu256(v);
            break;
          case SgemmEpilogue::Kind::DGelu: v = _mm256_mul_ps(v, gelu_grad256(load(e.aux + i * e.ld_aux + j0, h))); break;
        }
      }
      store(crow, h, v);
    }
  }
}

// The k range [lo, hi) of the kc-deep block from pc that a panel of rows [i, i + 6) needs, where op(A) is known
// to be zero outside the triangle (SgemmEpilogue::triangle).
inline void panel_k_range(const Job& jb, int64_t i, int64_t pc, int64_t kc, int64_t& lo, int64_t& hi) {
  lo = 0;
  hi = kc;
  switch (jb.e.triangle) {
    case SgemmEpilogue::Triangle::LowerA: hi = std::clamp<int64_t>(i + kMr + jb.e.diagonal - pc, 0, kc); break;
    case SgemmEpilogue::Triangle::UpperA: lo = std::clamp<int64_t>(i + jb.e.diagonal - pc, 0, kc); break;
    default: break;
  }
}

// Rows [i0, i0 + rows) and strips [s0, s1) of the packed block (columns from jc, kc deep from pc).
void run_task(const Job& jb, const float* bp, int64_t pc, int64_t kc, int64_t jc, int64_t nc, int64_t i0, int64_t rows,
              int64_t s0, int64_t s1) {
  alignas(64) float acc[kMr * kNr];
  if (kc == 0) {  // an empty product (A and B may be null): zero tiles through the epilogue
    std::fill(acc, acc + kMr * kNr, 0.0f);
    for (int64_t s = s0; s < s1; ++s)
      for (int64_t r = 0; r < rows; r += kMr)
        store_tile(jb, acc, i0 + r, jc + s * kNr, static_cast<int>(std::min<int64_t>(kMr, rows - r)),
                   static_cast<int>(std::min<int64_t>(kNr, jc + nc - (jc + s * kNr))), true, true);
    return;
  }
  // Untransposed, whole panels of 6 rows read op(A) in place (6 rows side by side) and a last partial one is
  // packed with zero rows. Transposed, op(A)'s 6 values of one k are adjacent but the next k's are a row of A
  // away: the block is packed (what it costs is small beside the products it serves).
  const int64_t whole = jb.ta ? 0 : rows / kMr * kMr;
  const int64_t rs = jb.lda, kc1 = std::max<int64_t>(kc, 1);
  const float* a = jb.a + i0 * rs + pc;
  float* packed = nullptr;
  if (whole < rows) {
    packed = t_pack_a.get((rows - whole + kMr - 1) / kMr * kMr * kc1 + 2);
    pack_a(jb.ta, jb.a, jb.lda, i0 + whole, rows - whole, pc, kc, packed);
  }
  const bool first = pc == 0, last = pc + kc >= jb.k;
  // Whole tiles of a single block of k with no more than a bias go straight from the registers to C.
  // The GELU epilogues of a single block of k run over the task's rows once its tiles are stored (the
  // transcendental work vectorises best in a loop of its own, on rows still in the cache).
  const bool gelu_after = first && last && jb.beta == 0.0f && !jb.e.addend &&
                          (jb.e.kind == SgemmEpilogue::Kind::BiasGelu || jb.e.kind == SgemmEpilogue::Kind::DGelu);
  const bool direct_ok = first && last && jb.beta == 0.0f && !jb.e.addend && jb.e.kind != SgemmEpilogue::Kind::DGelu;
  const float* bias = jb.e.kind == SgemmEpilogue::Kind::Bias || jb.e.kind == SgemmEpilogue::Kind::BiasGelu ? jb.e.bias : nullptr;
  Job plain = jb;  // the tiles of a GELU epilogue stored plain (with the bias of BiasGelu) first
  if (gelu_after) plain.e.kind = jb.e.kind == SgemmEpilogue::Kind::BiasGelu ? SgemmEpilogue::Kind::Bias : SgemmEpilogue::Kind::None;
  const Job& tj = gelu_after ? plain : jb;
  for (int64_t s = s0; s < s1; ++s) {
    const float* bs = bp + s * kc * kNr;
    const int64_t j0 = jc + s * kNr;
    const int nr = static_cast<int>(std::min<int64_t>(kNr, jc + nc - j0));
    for (int64_t r = 0; r < rows; r += kMr) {
      const int64_t i = i0 + r;
      const int mr = static_cast<int>(std::min<int64_t>(kMr, rows - r));
      // A tile wholly above the diagonal is not wanted (UpperC).
      if (jb.e.triangle == SgemmEpilogue::Triangle::UpperC && j0 > i + mr - 1 + jb.e.diagonal) continue;
      int64_t lo, hi;
      panel_k_range(jb, i, pc, kc, lo, hi);
      const float* ap = r < whole ? a + r * rs + lo : packed + (r - whole) * kc + lo * kMr;
      const int64_t ars = r < whole ? rs : 1, acs = r < whole ? 1 : kMr;
      const float* bk = bs + lo * kNr;
      const int64_t depth = std::max<int64_t>(hi - lo, 0);
      if (direct_ok && mr == kMr && nr == kNr) {
        kernel_6x16<true>(depth, ap, ars, acs, bk, jb.c + i * jb.ldc + j0, jb.ldc, jb.alpha, bias ? bias + j0 : nullptr);
      } else {
        kernel_6x16<false>(depth, ap, ars, acs, bk, acc, kNr, 1.0f, nullptr);
        store_tile(tj, acc, i, j0, mr, nr, first, last);
      }
    }
  }
  if (!gelu_after) return;
  const int64_t c0 = jc + s0 * kNr, cols = std::min(jc + nc, jc + s1 * kNr) - c0;
  for (int64_t r = 0; r < rows; ++r) {
    float* crow = jb.c + (i0 + r) * jb.ldc + c0;
    float* arow = jb.e.aux + (i0 + r) * jb.e.ld_aux + c0;
    if (jb.e.kind == SgemmEpilogue::Kind::BiasGelu) {
      std::memcpy(arow, crow, static_cast<size_t>(cols) * sizeof(float));
      gelu_tanh_f32(arow, crow, cols);
    } else {
      gelu_tanh_backward_f32(crow, arow, crow, cols);
    }
  }
}

}  // namespace

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const SgemmEpilogue& e, int threads) {
  TANDEM_ASSERT(sgemm_available(), "sgemm: this processor lacks AVX2 or FMA");
  TANDEM_ASSERT(!e.addend || beta == 0.0f, "sgemm: an addend with beta ", beta);
  if (m <= 0 || n <= 0) return;
  const Job jb{ta, tb, m, n, k, alpha, beta, a, lda, b, ldb, c, ldc, e};
  const int64_t row_blocks = (m + kMc - 1) / kMc;
  // k in blocks of equal depth (a multiple of 8), at most kKc.
  const int64_t k_blocks = (k + kKc - 1) / kKc;
  const int64_t kc_step = k_blocks <= 1 ? kKc : ((k + k_blocks - 1) / k_blocks + 7) / 8 * 8;
  for (int64_t jc = 0; jc < n; jc += kNc) {
    const int64_t nc = std::min(kNc, n - jc), strips = (nc + kNr - 1) / kNr;
    // One thread takes whole rows of blocks (A packed once); several split them into groups of strips too.
    const int64_t per_task = threads > 1 ? kStripsPerTask : strips;
    const int64_t strip_groups = (strips + per_task - 1) / per_task;
    // k == 0 still runs one (empty) block: the product is zero and the epilogue acts.
    for (int64_t pc = 0; pc < std::max<int64_t>(k, 1); pc += kc_step) {
      const int64_t kc = std::min(kc_step, k - pc);
      float* bp = t_pack_b.get(strips * kNr * std::max<int64_t>(kc, 1));
      if (kc > 0)
        parallel_tasks(strips, kc * strips * kNr >= 2 * kParallelElems ? threads : 1,
                       [&](int64_t s, int) { pack_b_strip(tb, b, ldb, pc, kc, jc, nc, s, bp); });
      parallel_tasks(row_blocks * strip_groups, threads, [&](int64_t t, int) {
        const int64_t rb = t / strip_groups, sg = t % strip_groups;
        const int64_t i0 = rb * kMc;
        run_task(jb, bp, pc, kc, jc, nc, i0, std::min(kMc, m - i0), sg * per_task, std::min(strips, (sg + 1) * per_task));
      });
    }
  }
}

void gelu_tanh_f32(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu256(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i mask = lane_mask(static_cast<int>(n - i));
    _mm256_maskstore_ps(y + i, mask, gelu256(_mm256_maskload_ps(x + i, mask)));
  }
}

void gelu_tanh_backward_f32(const float* g, const float* x, float* dx, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), gelu_grad256(_mm256_loadu_ps(x + i))));
  if (i < n) {
    const __m256i mask = lane_mask(static_cast<int>(n - i));
    _mm256_maskstore_ps(dx + i, mask,
                        _mm256_mul_ps(_mm256_maskload_ps(g + i, mask), gelu_grad256(_mm256_maskload_ps(x + i, mask))));
  }
}

#else  // no AVX2 + FMA in this build: the backend keeps OpenBLAS and the scalar functors

void sgemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float, float*,
           int64_t, const SgemmEpilogue&, int) {
  TANDEM_ASSERT(false, "sgemm: built without AVX2 and FMA");
}

void gelu_tanh_f32(const float* x, float* y, int64_t n) {
  const ewf::GeluTanhF<float> f{};
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

void gelu_tanh_backward_f32(const float* g, const float* x, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = ewf::gelu_tanh_grad_(g[i], x[i]);
}

#endif

}  // namespace tandem::backend::cpu
