/// @file
/// overlap._core: the Python binding of the compiled library. Contexts over
/// mpi4py communicators, the two ops (called, started, or asked for their
/// schedule) and the several-products form of all_gather_matmul, on NumPy
/// arrays and torch tensors without copies (python/src/arrays.hpp).
///
/// Every call is collective, and so is the way it fails: each rank first
/// converts its arguments, then the ranks exchange one row each (prelude):
/// whether that failed, how each operand is laid out, and this rank's extent
/// of the gathered dimension (which sizes the outputs a call allocates). A failure on any rank raises the same
/// error on every rank before any op starts; the library's own checks then
/// raise alike (std::invalid_argument, ValueError). The GIL is released
/// while MPI or the op runs.

#include <mpi.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "data_parallel.hpp"
#include "overlap/backend/onednn.hpp"
#include "overlap/overlap.hpp"

namespace overlap::python {
namespace {

// ---------------------------------------------------------------- contexts

/// A setting's field name without its unit ("progress_interval (us)": "progress_interval").
std::string field_name(const setting& s) {
  const std::string f(s.field);
  return f.substr(0, f.find(' '));
}

/// Which operand all_gather_matmul gathers (a for lhs_*), and whether along its rows.
bool gathers_lhs(gathered g) { return g == gathered::lhs_rows || g == gathered::lhs_cols; }
bool gathers_rows(gathered g) { return g == gathered::lhs_rows || g == gathered::rhs_rows; }

/// The config of Context(comm, **settings): the OVERLAP_* environment, then
/// the keyword settings (named as config's fields, valued as the variables
/// are written). A setting this rank cannot read goes into problems, which
/// the context's constructor raises on every rank.
overlap::config config_of(const py::kwargs& kw) {
  overlap::config cfg = overlap::config::from_env();
  for (const auto& item : kw) {
    const std::string key = py::str(item.first);
    const py::handle v = item.second;
    std::string text = py::isinstance<py::bool_>(v) ? (v.cast<bool>() ? "1" : "0") : py::str(v).cast<std::string>();
    std::string why = "is not a setting (they are:";
    const setting* found = nullptr;
    for (const setting& s : settings()) {
      const std::string field = field_name(s);
      if (field == key) found = &s;
      why += " " + field;
    }
    why = found != nullptr ? found->read(cfg, text.c_str()) : why + ")";
    if (!why.empty()) cfg.problems += std::string(cfg.problems.empty() ? "" : "; ") + key + "=" + text + " " + why;
  }
  return cfg;
}

/// overlap.Context: owns an overlap::context on a duplicate of an mpi4py
/// communicator (MPI.COMM_WORLD when none is given).
class py_context {
 public:
  py_context(const py::object& comm, const py::kwargs& kw) {
    MPI_Comm c = MPI_COMM_WORLD;
    if (!comm.is_none()) {
      if (!py::hasattr(comm, "py2f")) throw py::type_error("Context: comm must be an mpi4py communicator");
      c = MPI_Comm_f2c(comm.attr("py2f")().cast<MPI_Fint>());
    }
    overlap::config cfg = config_of(kw);
    py::gil_scoped_release unlocked;  // collective
    ctx_ = std::make_unique<overlap::context>(c, cfg);
    rank_ = ctx_->rank(), size_ = ctx_->size();
  }
  overlap::context& get() {
    if (!ctx_) throw std::logic_error("overlap.Context: the context is closed");
    return *ctx_;
  }
  /// Releases the context (waits for a started op first). Local.
  void close() {
    if (in_flight > 0) throw std::logic_error("overlap.Context.close: wait for the started op first");
    py::gil_scoped_release unlocked;
    ctx_.reset();
  }
  [[nodiscard]] bool closed() const { return !ctx_; }
  /// This rank and the ranks of the context (also once closed).
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  /// Started ops not yet waited for: close() refuses while there are any.
  int in_flight = 0;

 private:
  std::unique_ptr<overlap::context> ctx_;
  int rank_ = 0, size_ = 1;
};

// ------------------------------------------------------------- options

template <class E>
E enum_arg(const py::object& v, const char* name, E fallback) {
  if (v.is_none()) return fallback;
  const std::string text = py::str(v);
  E e = fallback;
  if (!parse_enum(text, e))
    throw std::invalid_argument(std::string(name) + "='" + text + "' must be one of " + enum_choices<E>(", "));
  return e;
}

/// The keyword options both ops share.
struct common_options {
  py::object strategy, algorithm, bias, activation;
  bool accumulate = false;

  template <class Options>
  void apply(Options& o) const {
    o.strategy = enum_arg(strategy, "strategy", overlap::strategy::automatic);
    o.algorithm = enum_arg(algorithm, "algorithm", overlap::algorithm::automatic);
    o.epilogue.activation = enum_arg(activation, "activation", overlap::activation::none);
    o.accumulate = accumulate;
  }
};

// ------------------------------------------------------------- the prelude

/// What every rank tells the others before a call starts.
struct prelude_row {
  int64_t failed = 0;  ///< this rank's conversion failed
  int64_t extent = 0;  ///< this rank's extent of the gathered dimension
  int64_t bias = -1;   ///< a bias whose length must equal that total (-1: none to check)
  /// How the operands (a, b, and gathered_out or the list of others) can be read (orientation).
  std::array<int64_t, 3> orient{2, 2, 2};
};
constexpr int prelude_words = 6;
static_assert(sizeof(prelude_row) == prelude_words * sizeof(int64_t));

/// What the ranks agreed on.
struct agreed_call {
  int64_t total = 0;                 ///< the gathered dimension's total over the ranks
  std::array<bool, 3> transposed{};  ///< per operand: read transposed
};

/// Collective: the ranks' rows. If a rank failed, every rank raises its
/// error (the lowest failing rank's): ValueError, or TypeError for a wrong
/// type. Otherwise every rank reads the same table: the total, and one
/// orientation per operand (transposed where any rank's must be).
agreed_call prelude(overlap::context& ctx, const detail::failure& mine, prelude_row row, const std::string& where,
                    const std::array<const char*, 3>& names = {"a", "b", "gathered_out"}) {
  ctx.check_usable(where.c_str());
  row.failed = mine.failed() ? 1 : 0;
  std::vector<prelude_row> table(static_cast<size_t>(ctx.size()));
  try {
    py::gil_scoped_release unlocked;
    detail::check_mpi(
        MPI_Allgather(&row, prelude_words, MPI_INT64_T, table.data(), prelude_words, MPI_INT64_T, ctx.comm()),
        "MPI_Allgather");
    bool failed = false;
    for (const prelude_row& r : table) failed = failed || r.failed != 0;
    if (failed) detail::broadcast_failure(ctx, mine, where);
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::logic_error& e) {  // type_problem, as the agreement carried it
    throw py::type_error(e.what());
  }
  agreed_call agreed;
  for (const prelude_row& r : table) agreed.total += r.extent;
  for (size_t i = 0; i < 3; ++i) {
    bool rows = false, transposed = false;
    for (const prelude_row& r : table) {
      rows = rows || r.orient[i] == static_cast<int64_t>(orientation::rows);
      transposed = transposed || r.orient[i] == static_cast<int64_t>(orientation::transposed);
    }
    if (rows && transposed)
      throw std::invalid_argument(where + ": " + names[i] +
                                  " is transposed (column-major) on some ranks and row-major on others");
    agreed.transposed[i] = transposed;
  }
  for (size_t r = 0; r < table.size(); ++r)
    if (table[r].bias >= 0 && table[r].bias != agreed.total)
      throw std::invalid_argument(
          where + ": bias on " + ctx.rank_name(static_cast<int>(r)) + " has " + std::to_string(table[r].bias) +
          " values; it must have one per column of the output (" + std::to_string(agreed.total) + ")");
  return agreed;
}

int64_t code(orientation o) { return static_cast<int64_t>(o); }

/// Runs `stage` (this rank's conversions), capturing what it throws for the prelude.
template <class F>
detail::failure local_stage(F&& stage) {
  try {
    stage();
  } catch (py::error_already_set& e) {
    return detail::failure(detail::failure::kind::other, e.what());
  } catch (...) {
    return detail::failure::capture(std::current_exception());
  }
  return {};
}

/// The dtype as NumPy and torch spell it.
std::string dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "float32";
    case dtype::f64: return "float64";
    case dtype::bf16: break;
  }
  return "bfloat16";
}

/// A 1-D contiguous bias of dtype t with `n` values (n < 0: checked in the prelude).
array bias_of(const py::object& obj, dtype t, int64_t n) {
  array b = as_array(obj, "bias");
  if (b.type != t) throw type_problem("bias has dtype " + dtype_name(b.type) + "; a has " + dtype_name(t));
  if (b.ndim != 1 || (b.rows > 1 && b.s0 != 1)) throw std::invalid_argument("bias must be a contiguous 1-D array");
  if (n >= 0 && b.rows != n)
    throw std::invalid_argument("bias has " + std::to_string(b.rows) +
                                " values; it must have one per column of the output (" + std::to_string(n) + ")");
  return b;
}

void same_type(const array& x, const array& a, const std::string& name) {
  if (x.type != a.type)
    throw type_problem(name + " has dtype " + dtype_name(x.type) + "; a has " + dtype_name(a.type) +
                       " (one dtype per call)");
}

/// The arrays a call uses, kept alive until it has finished.
struct keep_alive {
  std::vector<array> arrays;
  void add(const array& a) {
    if (a.owner) arrays.push_back(a);
  }
};

// ------------------------------------------------------------ handles

/// What start_* returns: the op in flight, the arrays it uses, its result.
class py_pending {
 public:
  py_pending(py_context& ctx, overlap::pending p, keep_alive keep, py::object result)
      : ctx_(&ctx), p_(std::move(p)), keep_(std::move(keep)), result_(std::move(result)) {
    ++ctx_->in_flight;
  }
  ~py_pending() {
    {
      py::gil_scoped_release unlocked;
      p_ = overlap::pending();  // waits, printing an error nobody waited for
    }
    done();
  }
  py_pending(const py_pending&) = delete;
  py_pending& operator=(const py_pending&) = delete;
  py::object wait() {
    {
      py::gil_scoped_release unlocked;
      p_.wait();
    }
    done();
    return result_;
  }
  bool test() {
    if (!p_.test()) return false;
    done();
    return true;
  }

 private:
  /// The op has finished: its arrays are free, and the context may close.
  void done() {
    keep_ = {};
    if (ctx_ != nullptr) --ctx_->in_flight;
    ctx_ = nullptr;
  }
  py_context* ctx_;
  overlap::pending p_;
  keep_alive keep_;
  py::object result_;
};

enum class mode { call, start, schedule };

py::dict schedule_dict(const overlap::schedule& s) {
  py::dict d;
  d["strategy"] = to_string(s.strategy);
  d["algorithm"] = to_string(s.algorithm);
  d["lanes"] = s.lanes;
  d["chunks"] = s.chunks;
  d["by_model"] = s.by_model;
  d["predicted_s"] = s.predicted_s < 0 ? py::object(py::none()) : py::object(py::float_(s.predicted_s));
  py::list candidates;
  for (const candidate& c : s.candidates) {
    py::dict e;
    e["strategy"] = to_string(c.strategy);
    e["algorithm"] = to_string(c.algorithm);
    e["chunks"] = c.chunks;
    e["predicted_s"] = c.predicted_s;
    candidates.append(e);
  }
  d["candidates"] = candidates;
  d["text"] = to_string(s);
  return d;
}

/// Runs a prepared call in `how`: returns the result, a handle, or the schedule.
template <class Call, class Start, class Schedule>
py::object finish(py_context& pc, mode how, keep_alive keep, py::object result, Call&& call, Start&& start,
                  Schedule&& sched) {
  if (how == mode::schedule) {
    overlap::schedule s;
    {
      py::gil_scoped_release unlocked;
      s = sched();
    }
    return schedule_dict(s);
  }
  if (how == mode::start) {
    overlap::pending p;
    {
      py::gil_scoped_release unlocked;
      p = start();
    }
    return py::cast(std::make_unique<py_pending>(pc, std::move(p), std::move(keep), std::move(result)));
  }
  {
    py::gil_scoped_release unlocked;
    call();
  }
  return result;
}

/// An output the caller gave: of a's dtype, row-major, writable.
array output_of(const py::handle obj, const array& a, const std::string& name) {
  array c = as_array(obj, name);
  same_type(c, a, name);
  orientation_of(c, name, false);
  if (!c.writable) throw std::invalid_argument(name + " is read-only");
  return c;
}

// ------------------------------------------------------------ all_gather_matmul

struct ag_request {
  py::object a, b, out;
  py::object gathered, gathered_out;
  common_options common;
};

/// all_gather_matmul with one other operand.
py::object ag_single(py_context& pc, const ag_request& r, mode how) {
  const char* where = "overlap.all_gather_matmul";
  overlap::context& ctx = pc.get();
  array a, b, c, g, bias;
  ag_options opt;
  bool want_out = r.out.is_none(), want_g = false;
  prelude_row row;
  const detail::failure mine = local_stage([&] {
    opt.gathered = enum_arg(r.gathered, "gathered", overlap::gathered::lhs_rows);
    r.common.apply(opt);
    a = as_array(r.a, "a"), b = as_array(r.b, "b");
    same_type(b, a, "b");
    row.orient = {code(orientation_of(a, "a", true)), code(orientation_of(b, "b", true)), code(orientation::either)};
    const array& x = gathers_lhs(opt.gathered) ? a : b;
    row.extent = gathers_rows(opt.gathered) ? x.rows : x.cols;  // of op(X), the gathered dimension
    if (!want_out) c = output_of(r.out, a, "out");
    if (py::isinstance<py::bool_>(r.gathered_out)) {
      want_g = r.gathered_out.cast<bool>();
    } else if (!r.gathered_out.is_none()) {
      g = as_array(r.gathered_out, "gathered_out"), same_type(g, a, "gathered_out");
      row.orient[2] = code(orientation_of(g, "gathered_out", true));
      if (!g.writable) throw std::invalid_argument("gathered_out is read-only");
    }
    if (!r.common.bias.is_none()) {
      const bool deferred = want_out && opt.gathered == gathered::rhs_cols;
      bias = bias_of(r.common.bias, a.type, deferred ? -1 : (want_out ? b.cols : c.ndim == 2 ? c.cols : -1));
      if (deferred) row.bias = bias.rows;
    }
    if (opt.accumulate && want_out)
      throw std::invalid_argument("accumulate=True needs out (its contents are added to)");
  });
  const agreed_call agreed = prelude(ctx, mine, row, where);
  const int64_t total = agreed.total;
  const bool lhs = gathers_lhs(opt.gathered);
  if (g.owner && agreed.transposed[2] != agreed.transposed[lhs ? 0 : 1])
    throw std::invalid_argument(std::string(where) +
                                ": gathered_out must be laid out as the sharded operand is (transposed when it is)");
  return with_type(a.type, [&](auto tag) -> py::object {
    using T = decltype(tag);
    const matrix_arg<T> av = matrix_of<T>(a, agreed.transposed[0]), bv = matrix_of<T>(b, agreed.transposed[1]);
    opt.transpose_a = av.transposed, opt.transpose_b = bv.transposed;
    const matrix_arg<T>& x = lhs ? av : bv;
    if (want_out) {
      // op(a) is M x K, op(b) K x N; the gathered dimension's total replaces this rank's extent.
      int64_t m = a.rows, n = b.cols;
      if (opt.gathered == gathered::lhs_rows) m = total;
      if (opt.gathered == gathered::rhs_cols) n = total;
      c = allocate_like(a, m, n, "out");
    }
    if (want_g) {  // laid out as X is stored, returned as op(X)
      const bool rows = gathers_rows(opt.gathered);
      const int64_t lr = rows ? total : (lhs ? a.rows : b.rows), lc = rows ? (lhs ? a.cols : b.cols) : total;
      g = allocate_like(a, x.transposed ? lc : lr, x.transposed ? lr : lc, "gathered_out");
      if (x.transposed) g = as_array(g.owner.attr("T"), "gathered_out");
    }
    const matrix_view<T> cv = matrix_of<T>(c, false).view;
    opt.epilogue.bias = bias.owner ? static_cast<const T*>(bias.data) : static_cast<const T*>(nullptr);
    keep_alive keep;
    for (const array* k : {&a, &b, &c, &g, &bias}) keep.add(*k);
    py::object result = c.owner;
    matrix_view<T> gv;
    const bool has_g = static_cast<bool>(g.owner);
    if (has_g) {
      gv = matrix_of<T>(g, x.transposed).view;
      if (want_g) result = py::make_tuple(c.owner, g.owner);
    }
    const matrix_view<const T> ca = av.view, cb = bv.view;
    return finish(
        pc, how, std::move(keep), result,
        [&] { has_g ? all_gather_matmul<T>(ctx, ca, cb, cv, gv, opt) : all_gather_matmul<T>(ctx, ca, cb, cv, opt); },
        [&] {
          return has_g ? start_all_gather_matmul<T>(ctx, ca, cb, cv, gv, opt)
                       : start_all_gather_matmul<T>(ctx, ca, cb, cv, opt);
        },
        [&] { return all_gather_matmul_schedule<T>(ctx, ca, cb, cv, opt); });
  });
}

/// all_gather_matmul with a list of other operands: one gather, several products.
py::object ag_list(py_context& pc, const ag_request& r) {
  const char* where = "overlap.all_gather_matmul";
  overlap::context& ctx = pc.get();
  ag_options opt;
  array x;
  std::vector<array> others, outs;
  bool want_out = r.out.is_none();
  prelude_row row;
  const detail::failure mine = local_stage([&] {
    opt.gathered = enum_arg(r.gathered, "gathered", overlap::gathered::lhs_rows);
    r.common.apply(opt);
    const bool lhs = gathers_lhs(opt.gathered);
    const py::object& list = lhs ? r.b : r.a;
    if (!py::isinstance<py::list>(list) && !py::isinstance<py::tuple>(list))
      throw std::invalid_argument(std::string("gathered='") + to_string(opt.gathered) + "' takes a list as " +
                                  (lhs ? "b" : "a") + " (the sharded operand is " + (lhs ? "a" : "b") + ")");
    x = as_array(lhs ? r.a : r.b, lhs ? "a" : "b");
    row.orient[lhs ? 0 : 1] = code(orientation_of(x, lhs ? "a" : "b", true));
    size_t i = 0;
    for (const py::handle o : list) {
      const std::string name = (lhs ? "b[" : "a[") + std::to_string(i++) + "]";
      others.push_back(as_array(o, name));
      same_type(others.back(), x, name);
      const int64_t its = code(orientation_of(others.back(), name, true)), &all = row.orient[2];
      if (its != code(orientation::either) && all != code(orientation::either) && its != all)
        throw std::invalid_argument("the other operands must all be transposed or none");
      if (its != code(orientation::either)) row.orient[2] = its;
    }
    if (!want_out) {
      i = 0;
      for (const py::handle o : r.out) outs.push_back(output_of(o, x, "out[" + std::to_string(i++) + "]"));
    }
    if (!r.common.bias.is_none()) throw std::invalid_argument("a bias is per output: call once per output for biases");
    if (!r.gathered_out.is_none()) throw std::invalid_argument("gathered_out is not offered with several products");
    if (opt.accumulate && want_out)
      throw std::invalid_argument("accumulate=True needs out (its contents are added to)");
    row.extent = gathers_rows(opt.gathered) ? x.rows : x.cols;
  });
  const bool lhs = gathers_lhs(opt.gathered);
  const agreed_call agreed = prelude(ctx, mine, row, where, {"a", "b", lhs ? "the list b" : "the list a"});
  const int64_t total = agreed.total;
  return with_type(x.type, [&](auto tag) -> py::object {
    using T = decltype(tag);
    const matrix_arg<T> xv = matrix_of<T>(x, agreed.transposed[lhs ? 0 : 1]);
    (lhs ? opt.transpose_a : opt.transpose_b) = xv.transposed;
    (lhs ? opt.transpose_b : opt.transpose_a) = agreed.transposed[2];
    std::vector<matrix_view<const T>> ov;
    py::list result;
    for (size_t i = 0; i < others.size(); ++i) {
      ov.push_back(matrix_of<T>(others[i], agreed.transposed[2]).view);
      if (want_out) {
        const int64_t m = lhs ? (opt.gathered == gathered::lhs_rows ? total : x.rows) : others[i].rows;
        const int64_t n = lhs ? others[i].cols : (opt.gathered == gathered::rhs_cols ? total : x.cols);
        outs.push_back(allocate_like(x, m, n, "out"));
      }
    }
    std::vector<matrix_view<T>> cv;
    for (size_t i = 0; i < outs.size(); ++i) {
      cv.push_back(matrix_of<T>(outs[i], false).view);
      result.append(outs[i].owner);
    }
    const matrix_view<const T> xc = xv.view;
    {
      py::gil_scoped_release unlocked;
      all_gather_matmul<T>(ctx, xc, ov, cv, opt);
    }
    return std::move(result);
  });
}

py::object ag_entry(py_context& pc, const ag_request& r, mode how) {
  const bool list = py::isinstance<py::list>(r.a) || py::isinstance<py::tuple>(r.a) || py::isinstance<py::list>(r.b) ||
                    py::isinstance<py::tuple>(r.b);
  if (!list) return ag_single(pc, r, how);
  if (how != mode::call)
    throw std::invalid_argument("several products (a list of operands) can only be called, not started or scheduled");
  return ag_list(pc, r);
}

// ------------------------------------ matmul_reduce_scatter, matmul_all_reduce

/// The arguments of the ops that sum partial products over the ranks
/// (a is M x K_r, b is K_r x N): `split` is their scattered= or reduced=.
struct sum_request {
  py::object a, b, out, split;
  bool bf16_transfers = false;
  common_options common;
};

/// This rank's share of `total` when it is split as evenly as the ranks allow.
int64_t even_share(int64_t total, int rank, int ranks) { return total / ranks + (rank < total % ranks ? 1 : 0); }

/// matmul_reduce_scatter for sum_entry: out is this rank's shard of the sum.
struct rs_sum {
  using options = rs_options;
  static constexpr const char* where = "overlap.matmul_reduce_scatter";
  static void split(options& o, const py::object& v) { o.scattered = enum_arg(v, "scattered", scattered::rows); }
  /// out's shape when the library allocates it: the scattered dimension split evenly.
  static std::pair<int64_t, int64_t> out_shape(const options& o, int64_t m, int64_t n, const context& ctx) {
    const bool rows = o.scattered == scattered::rows;
    return {rows ? even_share(m, ctx.rank(), ctx.size()) : m, rows ? n : even_share(n, ctx.rank(), ctx.size())};
  }
  template <class T, class... Args>  // (ctx, a, b, c, options), as the C++ call takes them
  static void call(Args&&... x) {
    matmul_reduce_scatter<T>(std::forward<Args>(x)...);
  }
  template <class T, class... Args>
  static pending start(Args&&... x) {
    return start_matmul_reduce_scatter<T>(std::forward<Args>(x)...);
  }
  template <class T, class... Args>
  static overlap::schedule plan(Args&&... x) {
    return matmul_reduce_scatter_schedule<T>(std::forward<Args>(x)...);
  }
};

/// matmul_all_reduce for sum_entry: out is the whole sum on every rank.
struct ar_sum {
  using options = ar_options;
  static constexpr const char* where = "overlap.matmul_all_reduce";
  static void split(options& o, const py::object& v) { o.reduced = enum_arg(v, "reduced", reduced::rows); }
  static std::pair<int64_t, int64_t> out_shape(const options& /*o*/, int64_t m, int64_t n, const context& /*ctx*/) {
    return {m, n};
  }
  template <class T, class... Args>  // (ctx, a, b, c, options), as the C++ call takes them
  static void call(Args&&... x) {
    matmul_all_reduce<T>(std::forward<Args>(x)...);
  }
  template <class T, class... Args>
  static pending start(Args&&... x) {
    return start_matmul_all_reduce<T>(std::forward<Args>(x)...);
  }
  template <class T, class... Args>
  static overlap::schedule plan(Args&&... x) {
    return matmul_all_reduce_schedule<T>(std::forward<Args>(x)...);
  }
};

/// An op that sums partial products (rs_sum, ar_sum): checks, agreement,
/// the output when not given, then the call, the start or the schedule.
template <class Op>
py::object sum_entry(py_context& pc, const sum_request& r, mode how) {
  overlap::context& ctx = pc.get();
  array a, b, c, bias;
  typename Op::options opt;
  const bool want_out = r.out.is_none();
  prelude_row row;
  const detail::failure mine = local_stage([&] {
    Op::split(opt, r.split);
    r.common.apply(opt);
    opt.bf16_transfers = r.bf16_transfers;
    a = as_array(r.a, "a"), b = as_array(r.b, "b");
    same_type(b, a, "b");
    row.orient = {code(orientation_of(a, "a", true)), code(orientation_of(b, "b", true)), code(orientation::either)};
    if (!want_out) c = output_of(r.out, a, "out");
    if (!r.common.bias.is_none()) {
      const int64_t n = want_out ? Op::out_shape(opt, a.rows, b.cols, ctx).second : (c.ndim == 2 ? c.cols : -1);
      bias = bias_of(r.common.bias, a.type, n);
    }
    if (opt.accumulate && want_out)
      throw std::invalid_argument("accumulate=True needs out (its contents are added to)");
  });
  const agreed_call agreed = prelude(ctx, mine, row, Op::where);
  return with_type(a.type, [&](auto tag) -> py::object {
    using T = decltype(tag);
    const matrix_arg<T> av = matrix_of<T>(a, agreed.transposed[0]), bv = matrix_of<T>(b, agreed.transposed[1]);
    opt.transpose_a = av.transposed, opt.transpose_b = bv.transposed;
    if (want_out) {  // pass out for another split of a scattered dimension
      const auto [m, n] = Op::out_shape(opt, a.rows, b.cols, ctx);
      c = allocate_like(a, m, n, "out");
    }
    const matrix_view<T> cv = matrix_of<T>(c, false).view;
    opt.epilogue.bias = bias.owner ? static_cast<const T*>(bias.data) : static_cast<const T*>(nullptr);
    keep_alive keep;
    for (const array* k : {&a, &b, &c, &bias}) keep.add(*k);
    const matrix_view<const T> ca = av.view, cb = bv.view;
    return finish(
        pc, how, std::move(keep), c.owner, [&] { Op::template call<T>(ctx, ca, cb, cv, opt); },
        [&] { return Op::template start<T>(ctx, ca, cb, cv, opt); },
        [&] { return Op::template plan<T>(ctx, ca, cb, cv, opt); });
  });
}

// ------------------------------------- the token exchange (mixture of experts)

/// The arguments of all_to_all_matmul and matmul_all_to_all: x's rows
/// travel to (dispatch) or come back from (combine) the experts' ranks.
struct a2a_request {
  py::object x, w, counts, out, strategy, dispatched_out;
  bool transpose_w = false;
};

/// dispatch (all_to_all_matmul) and combine (matmul_all_to_all) for a2a_entry.
struct a2a_dispatch_op {
  static constexpr const char* where = "overlap.all_to_all_matmul";
  static constexpr bool has_dispatched = true;
  /// The output's rows: what this rank's experts receive.
  static int64_t out_rows(const expert_counts& c) { return c.received_rows(); }
  template <class T>
  static void call(context& ctx, matrix_view<const T> x, matrix_view<const T> w, matrix_view<T> y,
                   matrix_view<T>* dispatched, const expert_counts& c, const a2a_options& o) {
    if (dispatched != nullptr)
      all_to_all_matmul<T>(ctx, x, w, y, *dispatched, c, o);
    else
      all_to_all_matmul<T>(ctx, x, w, y, c, o);
  }
  template <class T>
  static pending start(context& ctx, matrix_view<const T> x, matrix_view<const T> w, matrix_view<T> y,
                       matrix_view<T>* dispatched, const expert_counts& c, const a2a_options& o) {
    return dispatched != nullptr ? start_all_to_all_matmul<T>(ctx, x, w, y, *dispatched, c, o)
                                 : start_all_to_all_matmul<T>(ctx, x, w, y, c, o);
  }
};

struct a2a_combine_op {
  static constexpr const char* where = "overlap.matmul_all_to_all";
  static constexpr bool has_dispatched = false;
  /// The output's rows: this rank's token rows, back from the experts.
  static int64_t out_rows(const expert_counts& c) { return c.sent_rows(); }
  template <class T>
  static void call(context& ctx, matrix_view<const T> h, matrix_view<const T> w, matrix_view<T> out,
                   matrix_view<T>* /*dispatched*/, const expert_counts& c, const a2a_options& o) {
    matmul_all_to_all<T>(ctx, h, w, out, c, o);
  }
  template <class T>
  static pending start(context& ctx, matrix_view<const T> h, matrix_view<const T> w, matrix_view<T> out,
                       matrix_view<T>* /*dispatched*/, const expert_counts& c, const a2a_options& o) {
    return start_matmul_all_to_all<T>(ctx, h, w, out, c, o);
  }
};

/// The product's width: w is E * K x N (E * N x K with transpose_w).
int64_t a2a_width(const array& w, int experts, bool transpose_w) {
  return transpose_w ? (experts > 0 ? w.rows / experts : 0) : w.cols;
}

/// A token-exchange op: this rank's conversions, the agreement on them
/// (the prelude), the outputs it allocates, then the call or the start. The
/// library then checks the shapes and the counts against the peers'.
template <class Op>
py::object a2a_entry(py_context& pc, const a2a_request& r, mode how) {
  overlap::context& ctx = pc.get();
  array x, w, y, d;
  a2a_options opt;
  const expert_counts* counts = nullptr;
  bool want_d = false;
  const detail::failure mine = local_stage([&] {
    opt.strategy = enum_arg(r.strategy, "strategy", overlap::strategy::automatic);
    opt.transpose_w = r.transpose_w;
    if (!py::isinstance<expert_counts>(r.counts))
      throw type_problem("counts is a " + py::str(py::type::of(r.counts).attr("__name__")).cast<std::string>() +
                         "; expected an overlap.ExpertCounts (exchange_expert_counts makes one)");
    counts = r.counts.cast<const expert_counts*>();
    x = as_array(r.x, "x"), w = as_array(r.w, "w");
    same_type(w, x, "w");
    orientation_of(x, "x", false), orientation_of(w, "w", false);
    if (!r.out.is_none()) y = output_of(r.out, x, "out");
    if (py::isinstance<py::bool_>(r.dispatched_out)) {
      want_d = r.dispatched_out.cast<bool>();
    } else if (!r.dispatched_out.is_none()) {
      d = output_of(r.dispatched_out, x, "dispatched_out");
    }
    if ((want_d || d.owner) && !Op::has_dispatched)
      throw std::invalid_argument("dispatched_out is all_to_all_matmul's (the rows the experts received)");
  });
  prelude_row row;
  prelude(ctx, mine, row, Op::where);
  return with_type(x.type, [&](auto tag) -> py::object {
    using T = decltype(tag);
    if (!y.owner) y = allocate_like(x, Op::out_rows(*counts), a2a_width(w, counts->experts, opt.transpose_w), "out");
    if (want_d) d = allocate_like(x, counts->received_rows(), x.cols, "dispatched_out");
    keep_alive keep;
    for (const array* k : {&x, &w, &y, &d}) keep.add(*k);
    py::object result = (want_d || d.owner) ? py::object(py::make_tuple(y.owner, d.owner)) : y.owner;
    const matrix_view<const T> xv = matrix_of<T>(x, false).view, wv = matrix_of<T>(w, false).view;
    const matrix_view<T> yv = matrix_of<T>(y, false).view;
    matrix_view<T> dv = d.owner ? matrix_of<T>(d, false).view : matrix_view<T>{};
    matrix_view<T>* dp = d.owner ? &dv : nullptr;
    // A started op reads the counts while it starts: a copy outlives nothing it needs.
    return finish(
        pc, how, std::move(keep), result, [&] { Op::template call<T>(ctx, xv, wv, yv, dp, *counts, opt); },
        [&] { return Op::template start<T>(ctx, xv, wv, yv, dp, *counts, opt); },
        [&]() -> overlap::schedule { throw std::logic_error("the token exchange has no schedule_of"); });
  });
}

/// exchange_expert_counts on this rank's send counts (any sequence of
/// integers), agreed on before the exchange.
expert_counts exchange_counts(py_context& pc, int experts, const py::object& send) {
  overlap::context& ctx = pc.get();
  std::vector<int64_t> counts;
  const detail::failure mine = local_stage([&] {
    if (py::hasattr(send, "tolist")) {
      counts = send.attr("tolist")().cast<std::vector<int64_t>>();
    } else {
      counts = send.cast<std::vector<int64_t>>();
    }
  });
  prelude(ctx, mine, prelude_row{}, "overlap.exchange_expert_counts");
  py::gil_scoped_release unlocked;
  return exchange_expert_counts(ctx, experts, std::move(counts));
}

template <class Op, class... Extra>
void def_a2a(py::module_& m, const char* name, mode how, const char* doc, const Extra&... extra) {
  m.def(
      name,
      [how](py_context& ctx, py::object x, py::object w, py::object counts, py::object out, py::object strategy,
            bool transpose_w, py::object dispatched_out) {
        a2a_request r{std::move(x),   std::move(w),        std::move(counts),
                      std::move(out), std::move(strategy), std::move(dispatched_out),
                      transpose_w};
        return a2a_entry<Op>(ctx, r, how);
      },
      py::arg("ctx"), py::arg("x"), py::arg("w"), py::arg("counts"), py::arg("out") = py::none(), py::kw_only(),
      py::arg("strategy") = "automatic", py::arg("transpose_w") = false, py::arg("dispatched_out") = py::none(), doc,
      extra...);
}

// ---------------------------------------------------------------- the module

template <class Entry, class... Extra>
void def_ag(py::module_& m, const char* name, mode how, const char* doc, const Extra&... extra) {
  m.def(
      name,
      [how](py_context& ctx, py::object a, py::object b, py::object out, py::object gathered, py::object strategy,
            py::object algorithm, py::object bias, py::object activation, bool accumulate, py::object gathered_out) {
        ag_request r{std::move(a),
                     std::move(b),
                     std::move(out),
                     std::move(gathered),
                     std::move(gathered_out),
                     {std::move(strategy), std::move(algorithm), std::move(bias), std::move(activation), accumulate}};
        return Entry{}(ctx, r, how);
      },
      py::arg("ctx"), py::arg("a"), py::arg("b"), py::arg("out") = py::none(), py::kw_only(),
      py::arg("gathered") = "lhs_rows", py::arg("strategy") = "automatic", py::arg("algorithm") = "automatic",
      py::arg("bias") = py::none(), py::arg("activation") = py::none(), py::arg("accumulate") = false,
      py::arg("gathered_out") = py::none(), doc, extra...);
}

/// Defines an op that sums partial products; `split` names its keyword
/// (scattered= or reduced=, "rows" by default).
template <class Op, class... Extra>
void def_sum(py::module_& m, const char* name, const char* split, mode how, const char* doc, const Extra&... extra) {
  m.def(
      name,
      [how](py_context& ctx, py::object a, py::object b, py::object out, py::object split_as, py::object strategy,
            py::object algorithm, py::object bias, py::object activation, bool accumulate, bool bf16_transfers) {
        sum_request r{std::move(a),
                      std::move(b),
                      std::move(out),
                      std::move(split_as),
                      bf16_transfers,
                      {std::move(strategy), std::move(algorithm), std::move(bias), std::move(activation), accumulate}};
        return sum_entry<Op>(ctx, r, how);
      },
      py::arg("ctx"), py::arg("a"), py::arg("b"), py::arg("out") = py::none(), py::kw_only(), py::arg(split) = "rows",
      py::arg("strategy") = "automatic", py::arg("algorithm") = "automatic", py::arg("bias") = py::none(),
      py::arg("activation") = py::none(), py::arg("accumulate") = false, py::arg("bf16_transfers") = false, doc,
      extra...);
}

struct ag_fn {
  py::object operator()(py_context& c, const ag_request& r, mode how) const { return ag_entry(c, r, how); }
};

}  // namespace
}  // namespace overlap::python

PYBIND11_MODULE(_core, m) {
  using namespace overlap::python;  // NOLINT(google-build-using-namespace): the module's one scope
  namespace ov = overlap;
  m.doc() = "overlap's compiled core (use the overlap package)";
  m.attr("__version__") = ov::version();
  py::register_exception<ov::error>(m, "Error", PyExc_RuntimeError);
  m.def("cpu_isa", &ov::backend::cpu_isa, "The instruction set the GEMMs use here (after ONEDNN_MAX_CPU_ISA).");

  py::class_<py_context>(m, "Context",
                         "Context(comm=None, **settings): an overlap context on a duplicate of the mpi4py "
                         "communicator comm (MPI.COMM_WORLD by default). Collective over comm. settings are "
                         "overlap::config's fields (progress='poll', timeout_s=60, ...), laid over the OVERLAP_* "
                         "environment; a bad one raises ValueError on every rank.")
      .def(py::init<py::object, py::kwargs>(), py::arg("comm") = py::none())
      .def_property_readonly("rank", &py_context::rank)
      .def_property_readonly("size", &py_context::size)
      .def_property_readonly("closed", &py_context::closed)
      .def(
          "settings",
          [](py_context& c) {
            py::dict d;
            for (const ov::setting& s : ov::settings()) d[py::str(field_name(s))] = s.text(c.get().config());
            return d;
          },
          "The context's settings as text (the progress policy as chosen).")
      .def(
          "save_calibration",
          [](py_context& c, const std::string& path) {
            py::gil_scoped_release unlocked;
            return c.get().save_calibration(path);
          },
          py::arg("path"),
          "Writes the cost model's calibration, with the schedules automatic has measured so far, to path "
          "(rank 0 writes; call it on every rank) for a later context's calibration= (OVERLAP_CALIBRATION): "
          "its calls start from these instead of measuring. False where no calibration was needed.")
      .def(
          "measuring", [](py_context& c) { return c.get().measuring(); },
          "How many shapes strategy automatic is still timing candidates for (0: settled; the same on every "
          "rank).")
      .def("close", &py_context::close, "Releases the context (waits for a started op). Local.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_context& c, const py::args&) { c.close(); });

  def_gradient_reducer<py_context>(m);

  py::class_<py_pending>(m, "Pending", "A started op: wait() returns its output; test() asks without blocking.")
      .def("wait", &py_pending::wait)
      .def("test", &py_pending::test);

  def_ag<ag_fn>(m, "all_gather_matmul", mode::call, "out = AG(x) @ other (see the package's docstring); collective.");
  def_ag<ag_fn>(m, "start_all_gather_matmul", mode::start, "all_gather_matmul, started: returns a Pending.",
                py::keep_alive<0, 1>());
  def_ag<ag_fn>(m, "all_gather_matmul_schedule", mode::schedule, "The schedule all_gather_matmul runs, as a dict.");
  def_sum<rs_sum>(m, "matmul_reduce_scatter", "scattered", mode::call,
                  "out = this rank's shard of sum over ranks of a @ b.");
  def_sum<rs_sum>(m, "start_matmul_reduce_scatter", "scattered", mode::start,
                  "matmul_reduce_scatter, started: returns a Pending.", py::keep_alive<0, 1>());
  def_sum<rs_sum>(m, "matmul_reduce_scatter_schedule", "scattered", mode::schedule,
                  "The schedule matmul_reduce_scatter runs, as a dict.");
  def_sum<ar_sum>(m, "matmul_all_reduce", "reduced", mode::call, "out = sum over ranks of a @ b, on every rank.");
  def_sum<ar_sum>(m, "start_matmul_all_reduce", "reduced", mode::start,
                  "matmul_all_reduce, started: returns a Pending.", py::keep_alive<0, 1>());
  def_sum<ar_sum>(m, "matmul_all_reduce_schedule", "reduced", mode::schedule,
                  "The schedule matmul_all_reduce runs, as a dict.");

  py::class_<ov::expert_counts>(m, "ExpertCounts",
                                "ExpertCounts(experts, send, recv): token rows per (rank, local expert), from this "
                                "rank's side (overlap::expert_counts); exchange_expert_counts makes recv.")
      .def(py::init([](int experts, std::vector<int64_t> send, std::vector<int64_t> recv) {
             return ov::expert_counts{experts, std::move(send), std::move(recv)};
           }),
           py::arg("experts"), py::arg("send"), py::arg("recv"))
      .def_readonly("experts", &ov::expert_counts::experts)
      .def_readonly("send", &ov::expert_counts::send)
      .def_readonly("recv", &ov::expert_counts::recv)
      .def_property_readonly("sent_rows", &ov::expert_counts::sent_rows)
      .def_property_readonly("received_rows", &ov::expert_counts::received_rows)
      .def("__repr__", [](const ov::expert_counts& c) {
        return "ExpertCounts(experts=" + std::to_string(c.experts) + ", sent_rows=" + std::to_string(c.sent_rows()) +
               ", received_rows=" + std::to_string(c.received_rows()) + ")";
      });
  m.def("exchange_expert_counts", &exchange_counts, py::arg("ctx"), py::arg("experts"), py::arg("send"),
        "The counts of a routing from this rank's send counts; collective.");
  def_a2a<a2a_dispatch_op>(m, "all_to_all_matmul", mode::call, "Dispatch, then the local experts' product.");
  def_a2a<a2a_dispatch_op>(m, "start_all_to_all_matmul", mode::start, "all_to_all_matmul, started.",
                           py::keep_alive<0, 1>());
  def_a2a<a2a_combine_op>(m, "matmul_all_to_all", mode::call, "The local experts' product, then combine.");
  def_a2a<a2a_combine_op>(m, "start_matmul_all_to_all", mode::start, "matmul_all_to_all, started.",
                          py::keep_alive<0, 1>());
}
