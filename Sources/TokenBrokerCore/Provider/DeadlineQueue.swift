/// A min-heap of waiter deadlines: one structure that serves every deadline with one timer.
///
/// Removal is lazy: a cancelled entry stays in the heap until it reaches the top, where the
/// owner skips it because the waiter is gone, or until `keepOnly` drops it, which the owner
/// calls once the heap holds many more entries than waiters (so that a steady flow of answered
/// long-polls beside one that waits does not pile up). Insertion and removal of the earliest are O(log n).
struct DeadlineQueue<Instant: Comparable & Sendable>: Sendable {
    private var heap: [(deadline: Instant, id: UInt64)] = []

    var earliest: Instant? { heap.first?.deadline }

    mutating func insert(_ id: UInt64, at deadline: Instant) {
        heap.append((deadline, id))
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].deadline < heap[parent].deadline else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    /// Removes and returns the ids whose deadline is at or before `now`.
    mutating func popDue(at now: Instant) -> [UInt64] {
        var due: [UInt64] = []
        while let top = heap.first, top.deadline <= now {
            due.append(top.id)
            heap.swapAt(0, heap.count - 1)
            heap.removeLast()
            siftDown(from: 0)
        }
        return due
    }

    /// Every entry, in no order; cancelled waiters' among them.
    var entries: [(deadline: Instant, id: UInt64)] { heap }

    mutating func removeAll() { heap.removeAll() }

    /// The number of entries, cancelled ones among them.
    var count: Int { heap.count }

    /// Drops every entry whose id `isLive` refuses, and orders the rest into a heap again: O(n).
    mutating func keepOnly(_ isLive: (UInt64) -> Bool) {
        heap.removeAll { !isLive($0.id) }
        var parent = heap.count / 2
        while parent > 0 {
            parent -= 1
            siftDown(from: parent)
        }
    }

    private mutating func siftDown(from start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < heap.count, heap[left].deadline < heap[smallest].deadline { smallest = left }
            if right < heap.count, heap[right].deadline < heap[smallest].deadline { smallest = right }
            if smallest == parent { return }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
