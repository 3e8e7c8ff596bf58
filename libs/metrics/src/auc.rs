//! Exact ROC AUC: the probability that a random positive scores above a random negative,
//! ties counted half (Mann-Whitney U over average ranks).

/// `None` when `labels` hold only one class (AUC is undefined).
pub fn auc(scores: &[f64], labels: &[bool]) -> Option<f64> {
    let mut order: Vec<usize> = (0..scores.len().min(labels.len())).collect();
    order.sort_unstable_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let positives = order.iter().filter(|&&i| labels[i]).count() as f64;
    let negatives = order.len() as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return None;
    }
    let mut rank_sum = 0.0;
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && scores[order[end]] == scores[order[start]] {
            end += 1;
        }
        // Ranks start..end (1-based start+1..=end) share their average.
        let average_rank = (start + 1 + end) as f64 / 2.0;
        let tied_positives = order[start..end].iter().filter(|&&i| labels[i]).count();
        rank_sum += average_rank * tied_positives as f64;
        start = end;
    }
    Some((rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives))
}

#[cfg(test)]
mod tests {
    use super::auc;

    #[test]
    fn perfect_inverse_tied_and_undefined() {
        let labels = [false, false, true, true];
        assert_eq!(auc(&[0.1, 0.2, 0.3, 0.4], &labels), Some(1.0));
        assert_eq!(auc(&[0.4, 0.3, 0.2, 0.1], &labels), Some(0.0));
        assert_eq!(auc(&[0.5; 4], &labels), Some(0.5));
        // One of four pairs is inverted.
        assert_eq!(auc(&[0.1, 0.3, 0.2, 0.4], &labels), Some(0.75));
        assert_eq!(auc(&[0.1, 0.2], &[true, true]), None);
    }
}
