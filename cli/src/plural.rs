//! Counts with their nouns in the right number ("1 task", "2 tasks").

/// `n` followed by `one` when `n` is 1, else by `many`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn one_is_singular_and_everything_else_plural() {
        assert_eq!(count(0u32, "task", "tasks"), "0 tasks");
        assert_eq!(count(1u32, "task", "tasks"), "1 task");
        assert_eq!(count(2u64, "worker", "workers"), "2 workers");
    }
}
