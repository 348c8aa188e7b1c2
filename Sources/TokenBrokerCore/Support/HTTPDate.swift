/// Reads HTTP dates (RFC 9110 §5.6.7), for `Retry-After`: the preferred IMF-fixdate, such as
/// `Sun, 06 Nov 1994 08:49:37 GMT`, and the two obsolete forms a recipient must read too,
/// RFC 850's `Sunday, 06-Nov-94 08:49:37 GMT` and asctime's `Sun Nov  6 08:49:37 1994`.
public enum HTTPDate {
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    private static let weekdays = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    private static let longWeekdays = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

    /// The instant `text` names, or nil when it is none of the three forms. `now` places an RFC
    /// 850 date's two-digit year: in `now`'s century, unless that is more than 50 years after
    /// `now`, then in the century before (RFC 9110 §5.6.7).
    public static func parse(_ text: String, now: WallTime = WallTime()) -> WallTime? {
        let parts = text.split(separator: " ", omittingEmptySubsequences: false)
        // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT"
        if parts.count == 6, parts[0].count == 4, parts[0].hasSuffix(",") {
            guard weekdays.contains(String(parts[0].dropLast())), parts[5] == "GMT",
                let year = digits(parts[3], count: 4)
            else { return nil }
            return instant(year: year, month: parts[2], day: digits(parts[1], count: 2), clock: parts[4])
        }
        // rfc850-date: "Sunday, 06-Nov-94 08:49:37 GMT"
        if parts.count == 4, parts[0].hasSuffix(",") {
            let date = parts[1].split(separator: "-", omittingEmptySubsequences: false)
            guard longWeekdays.contains(String(parts[0].dropLast())), parts[3] == "GMT", date.count == 3,
                let lastTwo = digits(date[2], count: 2)
            else { return nil }
            // A two-digit year: this century's, unless that is more than 50 years on.
            let (thisYear, _, _, _) = civil(now)
            let century = thisYear - thisYear % 100
            guard
                let instant = instant(
                    year: century + lastTwo, month: date[1], day: digits(date[0], count: 2), clock: parts[2])
            else { return nil }
            guard fiftyYears(after: now) < instant else { return instant }
            return Self.instant(
                year: century - 100 + lastTwo, month: date[1], day: digits(date[0], count: 2), clock: parts[2])
        }
        // asctime-date: "Sun Nov  6 08:49:37 1994", or "Sun Nov 16 08:49:37 1994"
        let day: Int64?
        let rest: ArraySlice<Substring>
        if parts.count == 6, parts[2].isEmpty {
            (day, rest) = (digits(parts[3], count: 1), parts[4...])
        } else if parts.count == 5 {
            (day, rest) = (digits(parts[2], count: 2), parts[3...])
        } else {
            return nil
        }
        guard weekdays.contains(String(parts[0])), let year = digits(rest[rest.startIndex + 1], count: 4) else {
            return nil
        }
        return instant(year: year, month: parts[1], day: day, clock: rest[rest.startIndex])
    }

    /// The instant of a date and a time of day (`08:49:37`), each checked; nil when one is out of range.
    private static func instant(year: Int64, month: Substring, day: Int64?, clock: Substring) -> WallTime? {
        let time = clock.split(separator: ":", omittingEmptySubsequences: false)
        guard let day, (1...31).contains(day), let monthIndex = months.firstIndex(of: String(month)), time.count == 3,
            let hour = digits(time[0], count: 2), let minute = digits(time[1], count: 2),
            let second = digits(time[2], count: 2),
            hour < 24, minute < 60, second < 61
        else { return nil }
        let days = RFC3339.days(fromCivil: year, Int64(monthIndex + 1), day)
        return WallTime(timeIntervalSince1970: Double(days * 86_400 + hour * 3600 + minute * 60 + second))
    }

    /// The year, month and day of `time`, with the seconds since that day began.
    private static func civil(_ time: WallTime) -> (Int64, Int64, Int64, seconds: Double) {
        // `WallTime` is the clock's: any instant a real clock gives is far inside Int64's range.
        let days = Int64(rounding: time.timeIntervalSince1970 / 86_400, .down) ?? 0
        let (year, month, day) = RFC3339.civil(fromDays: days)
        return (year, month, day, time.timeIntervalSince1970 - Double(days) * 86_400)
    }

    /// The same date and time of day as `time`, 50 years on.
    private static func fiftyYears(after time: WallTime) -> WallTime {
        let (year, month, day, seconds) = civil(time)
        return WallTime(
            timeIntervalSince1970: Double(RFC3339.days(fromCivil: year + 50, month, day)) * 86_400 + seconds)
    }

    /// Exactly `count` ASCII digits (no sign, no space), as a number.
    private static func digits(_ text: Substring, count: Int) -> Int64? {
        guard text.utf8.count == count, text.utf8.allSatisfy({ (0x30...0x39).contains($0) }) else { return nil }
        return Int64(text)
    }
}
