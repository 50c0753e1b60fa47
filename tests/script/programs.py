"""Plain Python functions on NumPy arrays that tests run both as written and scripted."""

import numpy as np

import ember


def rnn_sequence(x, W, U, b):
    h = np.zeros((x.shape[1], W.shape[1]), x.dtype)
    for t in range(x.shape[0]):
        h = np.tanh(x[t] @ W + h @ U + b)
    return h


def newton_cube_root(a, tol):
    x = a
    while np.max(np.abs(x * x * x - a)) > tol:
        x = x - (x * x * x - a) / (3.0 * x * x)
    return x


def while_true_break(x, limit):
    total = np.zeros_like(x)
    k = 0
    while True:
        total = total + x * k
        k += 1
        if np.sum(total) > limit:
            break
    return total, k


def sum_odd_rows(x):
    acc = np.zeros(x.shape[1], x.dtype)
    for i in range(x.shape[0]):
        if np.sum(x[i]) < 0:
            continue
        acc += x[i]
    return acc


def nested_if_in_for(x, n):
    y = x
    for _i in range(n):
        if np.mean(y) > 0:
            if np.max(y) > 2.0:
                y = y * 0.5
            else:
                y = y + 1.0
        elif np.min(y) < -3.0:
            y = y * -0.25
        else:
            y = y - 0.5
    return y


def range_steps(x):
    acc = np.zeros_like(x)
    for i in range(1, 9, 3):
        acc = acc + x * i
    for j in range(10, 0, -2):
        acc = acc - x / j
    for _k in range(5, 5):
        acc = acc * 100.0
    return acc


def negative_step_index(x):
    out = np.zeros_like(x)
    for i in range(x.shape[0] - 1, -1, -1):
        out[i] = x[i] * (i + 1) + out[(i + 1) % x.shape[0]]
    return out


def carried_tuple(x, n):
    state = (x, np.zeros_like(x))
    for _i in range(n):
        a, b = state
        state = (a * 0.5 + b, b + a)
    return state


def _cell(h, c, w):
    c = np.tanh(h @ w) * 0.5 + c
    return np.tanh(c), c


scripted_cell = ember.script(_cell)


def lstm_like(h, w, n):
    c = np.zeros_like(h)
    for _i in range(n):
        h, c = scripted_cell(h, c, w)
    return h + c


def early_return_branches(x):
    if np.sum(x) > 0:
        return x * 2.0
    elif np.max(x) > 1.0:
        return x - 1.0
    return -x


def early_return_in_loop(x, n):
    for i in range(n):
        x = x * 1.5
        if np.max(x) > 10.0:
            return x, i
    return x, -1


def cumsum_setitem(x):
    out = np.zeros_like(x)
    running = x[0] * 0
    for i in range(x.shape[0]):
        running = running + x[i]
        out[i] = running
    return out


def slice_setitem(x):
    out = np.ones((x.shape[0] + 2,) + x.shape[1:], x.dtype)
    out[1:-1] = x * 3
    out[0] = out[-1] * 2
    return out


def const_branch_on_int(x, mode):
    if mode == 0:
        return np.sum(x, axis=0)
    elif mode == 1:
        return x.T @ x
    return np.max(x, axis=1, keepdims=True)


def softmax_rows(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def numpy_mix(x, y):
    z = np.where(x > y, np.sqrt(np.abs(x)), np.minimum(x, y) ** 2)
    w = np.concatenate((z, np.log(np.abs(y) + 1.0)), axis=0)
    k = np.argmax(w, axis=0)
    flags = np.any(w > 1.0) or np.all(w < 0.0)
    return w.astype(np.float64).mean(axis=1), k, flags


def mandelbrot_escape(c_re, c_im, max_iter):
    z_re = np.zeros_like(c_re)
    z_im = np.zeros_like(c_im)
    count = np.zeros(c_re.shape, np.int64)
    for _i in range(max_iter):
        inside = z_re * z_re + z_im * z_im <= 4.0
        if not np.any(inside):
            break
        z_re, z_im = (np.where(inside, z_re * z_re - z_im * z_im + c_re, z_re),
                      np.where(inside, 2.0 * z_re * z_im + c_im, z_im))
        count = count + inside.astype(np.int64)
    return count


def python_loop_unrolled(x, n):
    total = 0
    for i in range(n):
        total += i * i
    return x * total, total


def dynamic_count(x, n):
    for _i in range(n):
        x = x * 0.9 + 0.1
    return x


def bisection(lo, hi, target, tol):
    mid = (lo + hi) * 0.5
    while np.max(hi - lo) > tol:
        mid = (lo + hi) * 0.5
        too_big = mid * mid > target
        hi = np.where(too_big, mid, hi)
        lo = np.where(too_big, lo, mid)
    return mid



def return_in_nested_loops(x, n):
    for i in range(n):
        for j in range(n):
            x = x + 1.0
            if np.sum(x) > 20.0:
                return x * (i + 10 * j)
    return x


def loop_variable_after_break(x):
    for i in range(10):  # noqa: B007 (read after the loop)
        if np.max(x) > 5.0:
            break
        x = x * 2.0
    return x, i


def while_continue(x):
    k = 0
    while k < 10:
        k += 1
        if k % 2 == 0:
            continue
        x = x + k
    return x


def elementwise_setitem_2d(x):
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] * (i - j)
    out[:, 1] = out[:, 0] + 1
    return out


def conditional_expression(x, alpha=0.5):
    return x * alpha if np.sum(x) > 0 else -x


scripted_conditional = ember.script(conditional_expression)


def keyword_call(x):
    return scripted_conditional(x, alpha=2.0)


def integer_arithmetic(x):
    return x * 3 + 1, x / 2, x // 2, x % 3, -x


def while_data_tuple(x):
    a, b = x, x * 0
    it = 0
    while np.max(np.abs(a)) > 0.01 and it < 100:
        a, b = a * 0.5, b + a
        it += 1
    return a, b, it


@ember.script
def first_above(x, limit):
    for i in range(x.shape[0]):
        if x[i] > limit:
            return i, x[i]
    return -1, x[0] * 0


def calls_early_returning(x):
    a, b = first_above(x, 0.5)
    return a * 2, b


def search_with_all_exits(x, limit):
    k = 0
    total = x[0] * 0
    while True:
        if k >= x.shape[0]:
            break
        if x[k] < 0:
            k += 1
            continue
        total = total + x[k]
        if total > limit:
            return total, k
        k += 1
    return total, -1


def range_from_data(x):
    s = np.argmax(x)
    acc = x[0] * 0
    for i in range(s, x.shape[0]):
        acc = acc + x[i]
    for j in range(x.shape[0] - 1, s, -1):
        acc = acc - x[j] * 0.5
    return acc


def negative_runtime_index_setitem(x):
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        out[i - 1] = x[i] * 2
    return out


def tuple_and_dtype_arguments(pair, dt, scale=2.0):
    a, b = pair
    if a.dtype == np.float32:
        c = a * scale
    else:
        c = a - 1
    return (c + b).astype(dt), np.ones(a.shape, a.dtype), np.full((2,), 3)


def bound_unless_returned(x):
    if np.sum(x) > 0:
        y = x * 2
    else:
        return x
    return y + 1


def bound_unless_continued(x):
    total = np.zeros_like(x[0])
    for i in range(x.shape[0]):
        if np.sum(x[i]) > 0:
            row = x[i] * 2
        else:
            continue
        total = total + row
    return total


def numpy_scalars_are_strong(x):
    # NumPy's scalars are strong (np.exp(2) is float64), Python's weak (2.0).
    return x * np.exp(2), x * 2.0, np.sqrt(4.0) * x, x + np.float32(1), np.zeros(3) + x[0]


def bound_in_a_later_iteration(x):
    for i in range(5):
        if i == 3:
            y = x * i
    return y


def sliding_windows(x, k):
    # Runtime starts with lengths known when compiling: reads and writes.
    out = np.zeros((x.shape[0] - k + 1, k), x.dtype)
    smooth = x * 0
    for i in range(x.shape[0] - k + 1):
        out[i] = x[i:i + k] * (i + 1)
        smooth[i:i + k] = smooth[i:i + k] + x[i:i + k] / k
    pairs = np.zeros_like(x)
    for j in range(x.shape[0] // 2):
        pairs[2 * j:2 * j + 2] = x[2 * j:2 * j + 2][::-1]
    return out, smooth, pairs
