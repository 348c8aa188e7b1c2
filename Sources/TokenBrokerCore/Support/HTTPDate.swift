/// Reads HTTP dates in their preferred form, IMF-fixdate (RFC 9110 §5.6.7), such as
/// `Sun, 06 Nov 1994 08:49:37 GMT`, for `Retry-After`. The two obsolete forms are not read.
public enum HTTPDate {
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    private static let weekdays = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]

    public static func parse(_ text: String) -> WallTime? {
        // "Sun, 06 Nov 1994 08:49:37 GMT"
        let parts = text.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 6, parts[0].count == 4, parts[0].hasSuffix(","),
            weekdays.contains(String(parts[0].dropLast())),
            let day = digits(parts[1], count: 2), (1...31).contains(day),
            let monthIndex = months.firstIndex(of: String(parts[2])),
            let year = digits(parts[3], count: 4),
            parts[5] == "GMT"
        else { return nil }
        let clock = parts[4].split(separator: ":", omittingEmptySubsequences: false)
        guard clock.count == 3,
            let hour = digits(clock[0], count: 2), let minute = digits(clock[1], count: 2),
            let second = digits(clock[2], count: 2),
            hour < 24, minute < 60, second < 61
        else { return nil }
        let days = RFC3339.days(fromCivil: year, Int64(monthIndex + 1), day)
        return WallTime(timeIntervalSince1970: Double(days * 86_400 + hour * 3600 + minute * 60 + second))
    }

    /// Exactly `count` ASCII digits (no sign, no space), as a number.
    private static func digits(_ text: Substring, count: Int) -> Int64? {
        guard text.utf8.count == count, text.utf8.allSatisfy({ (0x30...0x39).contains($0) }) else { return nil }
        return Int64(text)
    }
}
