import Testing

@testable import TokenBrokerServer

/// `SlotTable` against a plain `Set` of the same objects, through long random runs of adding
/// and removing: it must hold exactly what the set holds, hand out each slot to one object at a
/// time, and reuse freed slots rather than grow.
struct SlotTableTests {
    final class Item {}

    /// A small deterministic generator, so that a failure can be replayed.
    struct Generator {
        var state: UInt64
        mutating func next(_ bound: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int((state >> 33) % UInt64(bound))
        }
    }

    @Test(arguments: [1, 7, 42])
    func holdsWhatASetHoldsThroughRandomAddsAndRemoves(seed: UInt64) {
        var table = SlotTable<Item>()
        var held: [(item: Item, slot: Int)] = []
        var reference = Set<ObjectIdentifier>()
        var mostHeld = 0
        var generator = Generator(state: seed)
        for step in 0..<20_000 {
            // Phases that mostly add, then mostly remove, down to empty now and then.
            let addPercent = (step / 1_000) % 2 == 0 ? 70 : 30
            if held.isEmpty || generator.next(100) < addPercent {
                let item = Item()
                let slot = table.insert(item)
                #expect(!held.contains { $0.slot == slot }, "slot \(slot) handed out twice")
                held.append((item, slot))
                reference.insert(ObjectIdentifier(item))
            } else {
                let (item, slot) = held.remove(at: generator.next(held.count))
                #expect(table.remove(at: slot) === item)
                #expect(table.remove(at: slot) == nil, "a freed slot gave something back")
                reference.remove(ObjectIdentifier(item))
            }
            mostHeld = max(mostHeld, held.count)
            if held.isEmpty { mostHeld = 0 }
            #expect(table.count == reference.count)
            #expect(table.slotCount <= mostHeld, "freed slots were not reused")
            if step % 500 == 0 || held.isEmpty {
                #expect(Set(table.elements.map(ObjectIdentifier.init)) == reference)
            }
        }
    }

    @Test func numberingStartsOverOnceEmpty() {
        var table = SlotTable<Item>()
        let items = (0..<5).map { _ in Item() }
        let slots = items.map { table.insert($0) }
        #expect(slots == [0, 1, 2, 3, 4])
        for slot in slots.reversed() { table.remove(at: slot) }
        #expect(table.count == 0 && table.slotCount == 0 && table.elements.isEmpty)
        #expect(table.insert(Item()) == 0)
        #expect(table.remove(at: 99) == nil)
    }
}
