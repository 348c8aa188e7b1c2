/// Objects kept in numbered slots: adding or removing one costs no hashing, and removing one
/// allocates nothing, since free slots are chained through a second array that grows with the
/// first. Whoever adds an object keeps its slot number, to remove it with.
///
/// Made for thousands of suspended connections resumed at once. Once every slot is free again,
/// numbering starts over and the space is kept for the next burst: two words per slot, and
/// never more slots than objects held at once.
public struct SlotTable<Element: AnyObject> {
    private var slots: [Element?] = []
    private var nextFree: [Int] = []
    private var firstFree = -1
    /// Objects held now.
    public private(set) var count = 0

    public init() {}

    /// Holds `element` in a free slot, or a new one; returns the slot.
    public mutating func insert(_ element: Element) -> Int {
        count += 1
        guard firstFree >= 0 else {
            slots.append(element)
            nextFree.append(-1)
            return slots.count - 1
        }
        let slot = firstFree
        firstFree = nextFree[slot]
        slots[slot] = element
        return slot
    }

    /// Lets go of the object in `slot` and returns it; nil when the slot holds none.
    @discardableResult
    public mutating func remove(at slot: Int) -> Element? {
        guard slots.indices.contains(slot), let element = slots[slot] else { return nil }
        slots[slot] = nil
        count -= 1
        if count == 0 {
            slots.removeAll(keepingCapacity: true)
            nextFree.removeAll(keepingCapacity: true)
            firstFree = -1
        } else {
            nextFree[slot] = firstFree
            firstFree = slot
        }
        return element
    }

    /// Every object held, in slot order.
    public var elements: [Element] { slots.compactMap { $0 } }

    /// Slots in use or free now: at most the most objects held at once since the table was last empty.
    public var slotCount: Int { slots.count }
}
